// The osprey engine: the one public API the CLI, the server and the bench tool
// use. Create an Engine from an EngineConfig, submit Requests, read each
// request's outputs from its RequestStream (blocking pull, or a callback),
// cancel, and query stats. Every Engine method is thread-safe.
//
// Conventions:
//   - Token ids are int32. Text is UTF-8; a text delta never splits a code point.
//   - Logprobs are natural-log probabilities of the RAW model logits (before
//     penalties, bias, temperature and truncation), as vLLM returns by default.
//   - Sampling with a seed is reproducible: the same request, seed and model
//     give the same tokens whatever else shares the batch.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "osprey/status.h"

namespace osprey {

class TextProcessor;

struct EngineConfig {
  std::string model_path;        // HF folder, .gguf file, or "default"
  std::string device = "cpu";    // "cpu", or "cuda" / "cuda:N" in builds with the CUDA backend
  // "auto" (safetensors or GGUF by path) or "dummy": random weights of the
  // right shapes from a config alone (model_path: a bundled config name such
  // as "llama-3-8b", a config.json, or a folder holding one), for benchmarks.
  std::string load_format = "auto";
  // Compute (activation) dtype: "auto", "float32", "bfloat16" or "float16".
  // "auto": float32 on the CPU; bfloat16 on CUDA.
  std::string dtype = "auto";
  // Tokenizer: "" (the model's own), "default", a folder, a tokenizer.json or
  // a .gguf. A dummy model without one accepts token ids only.
  std::string tokenizer;
  // KV page dtype: "auto" (the compute dtype), "float32", "bfloat16",
  // "float16", or "fp8" / "fp8_e4m3": one byte a value (twice bf16's
  // tokens in the same memory) under a K and a V scale per layer, the
  // checkpoint's self_attn.k_scale / v_scale where it has them, else 1.
  std::string kv_cache_dtype = "auto";
  // FP8 KV pages: set each layer's K and V scale at start-up from a built-in
  // calibration text run through the model (|K|, |V| max of each layer mapped
  // to 224 of E4M3's 448; src/engine/kv_calibration.h), instead of the
  // checkpoint's scales or 1. Needs kv_cache_dtype fp8.
  bool calculate_kv_scales = false;
  // Weight quantisation at load: "none" (or "") or "fp8": the decoder
  // layers' projections (q/k/v, o, gate/up, down) become FP8 E4M3 with one
  // scale a matrix, each projection's input is quantised to E4M3 per call
  // (one dynamic scale), and the products run on FP8 tensor cores (CUDA,
  // compute capability 8.9+, bfloat16 or float16 compute). Embeddings,
  // lm_head and norms stay as they are. Not bit-exact against the model.
  std::string quantization = "none";
  // CUDA: fraction of the device's total memory the engine may hold (weights,
  // step buffers, KV pool). The KV pool gets what is left after a profiling
  // forward at max_num_batched_tokens, unless kv_cache_bytes or num_kv_blocks
  // is set explicitly (kv_cache_bytes_explicit).
  double gpu_memory_utilization = 0.90;
  // CUDA: run decode steps eagerly instead of replaying captured graphs.
  bool enforce_eager = false;
  // Asynchronous scheduling: the engine loop schedules and builds step N + 1
  // and launches it while the device still runs step N, then processes step
  // N's results (tokens of step N feed step N + 1 on the device). Outputs are
  // identical either way. Steps that need step N's results on the host (host
  // sampling, prompt logprobs, penalties, n > 1 forks) wait for it first; the
  // CPU backend and the per-op profile always run synchronously.
  bool async_scheduling = true;
  // Per-op profile (Engine::profile()): times every backend op of every step
  // under a kernel group and measures the device's copy and GEMM ceilings at
  // start-up. Runs decode steps eagerly (no graphs); costs time per op.
  bool profile = false;
  // CPU: quantise activations to 8 bits inside matmuls with 8/4-bit
  // quantised weights (llama.cpp's method): faster, but logits no longer
  // match the fp32 reference exactly. Off by default.
  bool quantize_activations = false;
  int num_threads = 0;           // backend compute threads; <= 0: all cores
  int block_size = 16;           // tokens per KV page
  // KV pool size: num_kv_blocks when > 0, else kv_cache_bytes / (block_size * bytes per token).
  int64_t kv_cache_bytes = int64_t{1} << 30;
  bool kv_cache_bytes_explicit = false;  // set by --kv-cache-mb: overrides gpu_memory_utilization sizing
  int num_kv_blocks = 0;
  int max_num_batched_tokens = 2048;  // token budget of one step
  int max_num_seqs = 256;             // running sequences at most
  int max_model_len = 0;              // context length; 0: the model's own
  bool enable_prefix_caching = true;
  bool enable_chunked_prefill = true;
  // Host memory for swapping preempted sequences' KV pages (0: off). When on,
  // a preempted sequence's computed pages are copied to host slots and copied
  // back into fresh pages when it resumes; when the swap space is full it is
  // recomputed instead (the same output either way).
  int64_t swap_space_bytes = 0;
  // Priority aging, so that no request waits forever: requests are ordered by
  //   effective priority = priority - (engine steps since arrival) / priority_aging_steps
  // (smaller runs first, then arrival order). The age term grows at the same
  // rate for every request, so this equals ordering by the fixed key
  //   priority * priority_aging_steps + (engine step at arrival):
  // requests arriving in the same step are ordered by priority alone, and a
  // request of priority p arriving at step t runs before any request of
  // priority q < p arriving after step t + (p - q) * priority_aging_steps.
  // The same order picks preemption victims (the last one). <= 0: no aging
  // (strict priorities, which can starve low priorities under load).
  int priority_aging_steps = 256;
  uint64_t seed = 0;                  // base of the per-request seeds of unseeded requests
  int num_detokenizer_threads = 1;    // worker threads for detokenizing and stop strings
  // Logit rows of prompt tokens (prompt_logprobs) computed per step at most.
  int max_prompt_logprob_rows = 256;
  // Salt of prefix-cache keys; "" derives one from the model path and format.
  std::string cache_salt;
};

struct SamplingParams {
  int n = 1;                    // sequences sampled from one prompt
  int max_tokens = 16;          // generated tokens at most (> 0)
  int min_tokens = 0;           // EOS, stop ids and stop strings ignored before this many
  float temperature = 1.0f;     // 0: greedy (argmax, ties to the lowest id)
  int top_k = 0;                // <= 0: off
  float top_p = 1.0f;           // (0, 1]
  float min_p = 0.0f;           // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; on prompt + output tokens (HF / vLLM)
  float presence_penalty = 0.0f;    // [-2, 2]; on output tokens (OpenAI)
  float frequency_penalty = 0.0f;   // [-2, 2]; on output tokens (OpenAI)
  std::map<int32_t, float> logit_bias;  // added to raw logits
  std::optional<uint64_t> seed;
  int logprobs = -1;            // -1: off; k >= 0: the sampled token's logprob plus top k
  int prompt_logprobs = -1;     // -1: off; k >= 0: per prompt token, plus top k
  std::vector<std::string> stop;       // stop strings (matched on detokenized text)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;

  // A clear message for the first invalid field, or ok.
  Status validate(int vocab_size) const;
};

struct Request {
  std::string request_id;               // "" : the engine assigns one
  std::string prompt;                   // used when prompt_token_ids is empty
  std::vector<int32_t> prompt_token_ids;
  bool add_special_tokens = true;       // when encoding `prompt`
  SamplingParams params;
  int priority = 0;                     // smaller runs first (then arrival order), aged:
                                        // see EngineConfig::priority_aging_steps
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
// "stop", "length", "abort", "error" ("" for kNone).
const char* finish_reason_name(FinishReason r);

struct TopLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::string token;  // the token's own text (decoded alone)
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  int rank = 0;                 // 1 = most likely
  std::string token;
  std::vector<TopLogprob> top;  // the `logprobs` most likely tokens, best first
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;    // over all n sequences
  int cached_tokens = 0;        // prompt tokens served from the prefix cache
};

// What one sequence produced since the previous output.
struct CompletionOutput {
  int index = 0;                          // in [0, n)
  std::vector<int32_t> token_ids;         // new token ids (a final EOS / stop id included)
  std::string text;                       // new text
  std::vector<TokenLogprob> logprobs;     // one per new token when requested
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_string;                // the stop string that ended it, if any
  int32_t stop_token_id = -1;             // the stop token id (or EOS) that ended it, or -1
};

struct RequestOutput {
  std::string request_id;
  std::vector<CompletionOutput> outputs;  // only sequences with news
  // Set on the first output of a request that asked for prompt_logprobs: one
  // entry per prompt token (the first has none: token_id set, logprob 0, rank 0).
  std::vector<TokenLogprob> prompt_logprobs;
  bool finished = false;                  // every sequence has finished
  // Queue time: seconds from submit() to the start of the engine step that
  // first scheduled the request (its prefill not included). Set on exactly one
  // output, the first delivered after that step (in practice the request's
  // first output); unset on the others, and when it was never scheduled.
  std::optional<double> queue_time_s;
  Usage usage;                            // running totals; final when finished
  Status error;                           // set when finish is kError
};

// One request's outputs, in order. Thread-safe; next() is meant for one consumer.
class RequestStream {
 public:
  virtual ~RequestStream() = default;
  virtual const std::string& request_id() const = 0;
  // Blocks until an output is ready; nullopt after the finished one was returned.
  virtual std::optional<RequestOutput> next() = 0;
  // As next(), but gives up after `timeout` (returns nullopt; check done()).
  virtual std::optional<RequestOutput> next_for(std::chrono::milliseconds timeout) = 0;
  // True once the finished output has been returned by next().
  virtual bool done() const = 0;
  // Aborts the request (finish reason "abort"); a no-op once finished.
  virtual void cancel() = 0;
};

// Called on an engine worker thread for each output, in order, instead of
// queueing it for next(). Must not block for long and must not call next().
using OutputCallback = std::function<void(const RequestOutput&)>;

struct EngineStats {
  int num_running = 0;          // sequences
  int num_waiting = 0;          // sequences
  int num_kv_blocks = 0;
  int num_free_kv_blocks = 0;   // unreferenced (including evictable cached pages)
  int block_size = 0;
  double kv_usage = 0.0;        // referenced fraction of the pool
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  double prefix_hit_rate = 0.0;
  int64_t num_prompt_tokens = 0;      // computed prompt tokens (prefill work)
  int64_t num_generated_tokens = 0;
  int64_t num_preemptions = 0;       // recompute and swap
  int64_t num_swap_outs = 0;         // preemptions that swapped to host memory
  int num_swap_blocks = 0;           // host swap slots (pages) in all
  int num_free_swap_blocks = 0;
  int64_t num_steps = 0;
  int64_t num_finished_requests = 0;
  // Engine-loop timing over decode-only steps (every scheduled sequence
  // computes one token), nanoseconds summed over those steps. Host time per
  // step = schedule + build + update + loop; forward = the executor's part.
  int64_t num_decode_steps = 0;
  int64_t decode_tokens = 0;
  int64_t decode_schedule_ns = 0;  // scheduler
  int64_t decode_build_ns = 0;     // batch building (host index arrays)
  // executor: page copies, forward, logits to host; with async_scheduling the
  // time the loop spends launching the step and blocked waiting for it
  int64_t decode_forward_ns = 0;
  int64_t decode_update_ns = 0;    // sampling and sequence updates
  int64_t decode_sample_ns = 0;    // of which in the sampler
  int64_t decode_loop_ns = 0;      // the rest of the loop: commands, stats, handing events to workers
  // Device backends: device time of decode steps (copies, forward, sampling)
  // over num_timed_decode_steps; busy fraction = device / (host + forward) time.
  int64_t decode_device_ns = 0;
  int64_t num_timed_decode_steps = 0;
  // Steps launched while the previous one was still running (async_scheduling).
  int64_t num_overlapped_steps = 0;
};

struct ModelInfo {
  std::string model_path;
  int vocab_size = 0;
  int max_model_len = 0;
  int num_kv_blocks = 0;
  int block_size = 0;
};

// One kernel group of the per-op profile (EngineConfig::profile). Bytes are
// the op's minimum memory traffic (operands read once, outputs written once;
// attention: the KV its sequences read); FLOPs count 2 per multiply-add.
struct ProfileEntry {
  std::string phase;  // "prefill" (steps with prompt tokens), "decode" (one token per sequence), "other"
  std::string group;  // "attention", "rms_norm", "sample", "matmul 6144x4096 bf16" (weight rows x cols), ...
  int64_t calls = 0;
  double total_ms = 0;  // device time inside the op's timer marks
  double bytes = 0;
  double flops = 0;
};

struct ProfileReport {
  std::vector<ProfileEntry> entries;  // by phase (prefill, decode, other), then time, largest first
  int64_t prefill_steps = 0;
  int64_t decode_steps = 0;
  int64_t untimed_calls = 0;  // ops left out (too many in one step)
  // The device's ceilings measured when the engine started (0: unknown).
  double copy_gbs = 0;        // device-to-device copy, read + write bytes / s / 1e9
  double gemm_tflops = 0;     // the backend's own matmul
  std::string gemm_shape;     // e.g. "bf16 4096x4096x4096"
};

class Engine {
 public:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  ~Engine();  // shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Loads the model and tokenizer, sizes the KV pool, starts the engine loop.
  static Expected<std::unique_ptr<Engine>> create(const EngineConfig& config);

  // Validates and tokenizes (on the calling thread) and queues the request.
  // Errors: invalid parameters; prompt (+1 token) longer than max_model_len or
  // than the whole KV pool (never admitted); engine shut down.
  Expected<std::shared_ptr<RequestStream>> submit(Request request, OutputCallback callback = nullptr);
  // Aborts a request by id; false when no such request is in flight.
  bool cancel(const std::string& request_id);

  EngineStats stats() const;
  ModelInfo model_info() const;
  // The per-op profile since the engine started or the last reset_profile()
  // (empty unless EngineConfig::profile). Steps still running are not in it.
  ProfileReport profile() const;
  void reset_profile();

  // Tokenizer helpers, so that callers need only this header.
  Expected<std::vector<int32_t>> encode(const std::string& text, bool add_special_tokens = true) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  // The model's tokenizer and chat template (include osprey/text.h to use it).
  std::shared_ptr<const TextProcessor> text() const;

  // Stops the loop; requests still in flight finish with "abort". Idempotent.
  void shutdown();

  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey
