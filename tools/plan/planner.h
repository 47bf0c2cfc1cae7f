// The roofline planner behind `osprey plan`: memory (weights, KV cache,
// reserve) and speed-of-light / expected TTFT and TPOT for a model shape on a
// GPU. Every formula is written out in docs/plan.md; the comments here name
// units. Bytes and FLOPs are per GPU unless a name says "total".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "osprey/model_info.h"
#include "osprey/status.h"
#include "plan/gpu_table.h"

namespace osprey::plan {

// Which tensor-core rate a weight format's matmuls run at.
enum class ComputeRate { k16, kFp8, kInt8 };

struct WeightFormat {
  std::string name;  // "bf16", "fp8", "int4", "q4_1", ...
  double bits = 16;  // stored bits per weight, scales included (q4_1: 5.0)
  ComputeRate rate = ComputeRate::k16;
  std::string head_default;  // format of the embedding / lm_head when not given
};

// bf16, fp16, fp32, fp8, int8 (W8A8), int4 (weight-only, W4A16), q8_0, q4_0,
// q4_1 (GGUF blocks, weight-only); an unknown name is an error listing them.
Expected<WeightFormat> weight_format(const std::string& name);
// bf16, fp16, fp8, int8, fp32 -> bytes per element (int8: osprey's pages,
// 1 + 4 / head_dim with each row's fp32 scale).
Expected<double> kv_dtype_bytes(const std::string& name, int head_dim);

// What the user asked for; empty strings and zeros mean "the default".
struct PlanOptions {
  std::string dtype;                  // "" : "file" for a GGUF with weights, else "bf16"
  std::string head_dtype;             // "" : the format's head_default
  std::optional<double> weight_bits;  // overrides the layer matrices' bits
  std::string kv_dtype;               // "" : bf16 (fp16 on a GPU without bf16; same size)
  int tp = 1;
  int64_t context = 0;     // 0 : min(4096, the model's max context)
  int64_t prompt_len = 0;  // 0 : min(1024, the model's max context)
  std::vector<int64_t> batches = {1, 8, 32, 64, 128, 256};
  double price_per_hour = 0;  // $ per GPU-hour; 0: no cost figures
  double gpu_memory_utilization = 0.9;
  double mbu = 0.8;                   // expected fraction of memory bandwidth
  double mfu = 0.6;                   // expected fraction of the matmul rate
  int64_t max_batched_tokens = 8192;  // the step's token budget (activation reserve)
  int64_t max_num_seqs = 256;         // logits rows reserved
  double overhead_gib = 1.0;          // CUDA context, cuBLAS workspace, graphs
  int64_t block_size = 16;            // KV page, tokens
};

// One roofline evaluation, seconds.
struct Roofline {
  double compute_s = 0;  // FLOPs / rate
  double memory_s = 0;   // bytes / bandwidth
  double comm_s = 0;     // tensor-parallel all-reduces
  double time_s = 0;     // max(compute, memory) + comm
  bool compute_bound = false;
};

struct DecodePoint {
  int64_t batch = 0;
  bool fits = true;                                               // batch x context fits the KV budget
  double flops = 0, bytes = 0;                                    // per GPU per step
  Roofline sol, expected;                                         // speed of light; with mfu / mbu
  double tokens_per_s_per_gpu_sol = 0, tokens_per_s_per_gpu = 0;  // output tokens
  double cost_per_mtok_sol = 0, cost_per_mtok = 0;                // $ per million output tokens; 0 when unpriced
};

struct PlanResult {
  ModelShape model;
  GpuSpec gpu;
  PlanOptions options;  // with defaults resolved
  std::string dtype, head_dtype, kv_dtype;
  double layer_bits = 0, head_bits = 0, kv_bytes = 0;
  std::vector<std::string> notes;  // warnings worth printing

  // Parameters (elements). layers: all decoder-layer parameters; embedding
  // and head: vocab x hidden each (the same tensor when tied).
  int64_t params_total = 0, params_layers = 0, params_embedding = 0, params_head = 0;

  // Memory, bytes.
  double weight_bytes_total = 0;         // all weights, whole model
  double weight_bytes_per_gpu = 0;       // total / tp
  double weight_read_bytes_per_gpu = 0;  // read once per forward (no untied embedding)
  double kv_bytes_per_token_total = 0;   // layers x 2 x kv_heads x head_dim x kv_bytes
  double kv_bytes_per_token_per_gpu = 0;
  int kv_heads_per_gpu = 0;
  double usable_bytes = 0, activation_bytes = 0, reserve_bytes = 0, kv_budget_bytes = 0;
  int64_t kv_tokens = 0;   // tokens of KV that fit, whole pages
  int64_t context = 0;     // evaluated context length
  int64_t context_kv = 0;  // KV tokens one sequence of that context holds (sliding window)
  int64_t max_batch = 0;   // sequences of `context` that fit
  bool fits = false;
  std::string fit_problem;  // why not, when !fits

  // Prefill of one prompt.
  double prefill_flops_total = 0, prefill_flops = 0, prefill_bytes = 0;
  Roofline ttft_sol, ttft_expected;

  std::vector<DecodePoint> decode;
  // Batch at which decode compute time equals memory time, at `context` and
  // with no KV (weights only); nullopt: memory-bound at every batch.
  std::optional<double> crossover_sol, crossover_expected;
  std::optional<double> crossover_weights_only_sol, crossover_weights_only_expected;
};

// Validates the options against the model and GPU and computes every figure.
Expected<PlanResult> make_plan(const ModelShape& model, const GpuSpec& gpu, const PlanOptions& options);

// Causal attention key count for a prompt of n tokens: sum over i = 1..n of
// min(i, window) (window 0: no window).
double causal_key_count(int64_t n, int64_t window);

// "--compare gpu=h100-sxm,a100-80gb" -> {"gpu", {...}}. Fields: gpu, dtype,
// kv-dtype, tp; at least one value, none empty.
struct CompareSpec {
  std::string field;
  std::vector<std::string> values;
};
Expected<CompareSpec> parse_compare(const std::string& text);
// "1,8,32" -> {1, 8, 32}: positive integers.
Expected<std::vector<int64_t>> parse_batches(const std::string& text);

}  // namespace osprey::plan
