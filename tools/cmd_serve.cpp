// osprey serve: the OpenAI-compatible HTTP server (docs/server.md).
#include <cstdio>
#include <memory>
#include <thread>

#include "commands.h"
#include "osprey/model_info.h"
#include "server/server.h"

namespace osprey::cli {

namespace {

struct ServeOptions {
  std::string model = "default";
  std::vector<std::string> served_model_names;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  int max_queue = 0;
  double shutdown_timeout = 30.0;
  std::vector<std::string> cors_origins;
  int io_threads = 2;
  int workers = 0;
  double max_body_mb = 8.0;
  double request_timeout = 30.0;
  double keep_alive_timeout = 60.0;
  std::string chat_template;
  std::string tool_call_parser = "auto";
  // Engine.
  int threads = 0;
  std::string device = "cpu";
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int kv_cache_mb = 1024;
  bool kv_cache_mb_set = false;  // --kv-cache-mb given: overrides --gpu-memory-utilization sizing
  double gpu_memory_utilization = 0.90;
  bool enforce_eager = false;
  bool no_async_scheduling = false;
  int swap_space_mb = 0;
  int block_size = 16;
  bool no_prefix_caching = false;
  bool quantize_activations = false;
  int max_model_len = 0;
  int64_t seed = 0;
  std::string dtype = "auto";
  std::string kv_cache_dtype = "auto";
  std::string load_format = "auto";
  std::string tokenizer;
};

int run_serve(const ServeOptions& o) {
  auto path = o.load_format == "dummy" ? Expected<std::string>(o.model) : resolve_model_path(o.model);
  if (!path.ok()) {
    std::fprintf(stderr, "osprey: %s\n", path.status().to_string().c_str());
    return 1;
  }
  server::ServerConfig c;
  c.model_arg = o.model;
  c.served_model_names = o.served_model_names;
  c.engine.model_path = *path;
  c.engine.num_threads = o.threads;
  c.engine.device = o.device;
  c.engine.quantize_activations = o.quantize_activations;
  c.engine.max_num_seqs = o.max_num_seqs;
  c.engine.max_num_batched_tokens = o.max_num_batched_tokens;
  c.engine.kv_cache_bytes = int64_t{o.kv_cache_mb} << 20;
  c.engine.kv_cache_bytes_explicit = o.kv_cache_mb_set;
  c.engine.gpu_memory_utilization = o.gpu_memory_utilization;
  c.engine.enforce_eager = o.enforce_eager;
  c.engine.async_scheduling = !o.no_async_scheduling;
  c.engine.dtype = o.dtype;
  c.engine.kv_cache_dtype = o.kv_cache_dtype;
  c.engine.load_format = o.load_format;
  c.engine.tokenizer = o.tokenizer;
  c.engine.swap_space_bytes = int64_t{o.swap_space_mb} << 20;
  c.engine.block_size = o.block_size;
  c.engine.enable_prefix_caching = !o.no_prefix_caching;
  c.engine.max_model_len = o.max_model_len;
  c.engine.seed = static_cast<uint64_t>(o.seed);
  c.http.host = o.host;
  c.http.port = o.port;
  c.http.num_io_threads = o.io_threads;
  c.http.num_worker_threads =
      o.workers > 0 ? o.workers : static_cast<int>(std::max(2u, std::min(8u, std::thread::hardware_concurrency())));
  c.http.max_body_bytes = static_cast<size_t>(o.max_body_mb * 1024 * 1024);
  c.http.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.request_timeout * 1000));
  c.http.keep_alive_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.keep_alive_timeout * 1000));
  c.http.cors_origins = o.cors_origins;
  c.api_key = o.api_key;
  if (c.api_key.empty())
    if (const char* env = std::getenv("OSPREY_API_KEY")) c.api_key = env;
  c.max_queue = o.max_queue;
  c.shutdown_timeout_s = o.shutdown_timeout;
  c.chat_template_path = o.chat_template;
  c.tool_call_parser = o.tool_call_parser;
  return server::run_server(c);
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  cmd->add_option("--model", o->model, "Model folder, .gguf file, or 'default'");
  cmd->add_option("--served-model-name", o->served_model_names,
                  "Name(s) clients use in 'model' (default: the model file name)");
  cmd->add_option("--host", o->host, "Address to listen on");
  cmd->add_option("--port", o->port, "Port to listen on (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on /v1/* (or $OSPREY_API_KEY)");
  cmd->add_option("--max-queue", o->max_queue,
                  "Requests waiting for their first token at most; more get 429 (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout,
                  "Seconds to drain in-flight requests after SIGTERM before aborting them")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--cors-origin", o->cors_origins, "Allow browser requests from this origin ('*' for any)");
  cmd->add_option("--io-threads", o->io_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  cmd->add_option("--http-workers", o->workers, "Threads that parse, template and tokenize requests (0: auto)")
      ->check(CLI::Range(0, 256));
  cmd->add_option("--max-body-mb", o->max_body_mb, "Largest request body in MiB (larger: 413)")
      ->check(CLI::Range(0.001, 1024.0));
  cmd->add_option("--request-timeout", o->request_timeout,
                  "Seconds a client has to send a whole request once it started (slower: 408)")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--keep-alive-timeout", o->keep_alive_timeout, "Seconds an idle keep-alive connection is kept")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--chat-template", o->chat_template,
                  "Jinja file replacing the model's chat template")
      ->check(CLI::ExistingFile);
  cmd->add_option("--tool-call-parser", o->tool_call_parser,
                  "How tool calls are read from chat output: auto (from the chat template), hermes, llama3_json, "
                  "mistral, none")
      ->check(CLI::IsMember({"auto", "hermes", "llama3_json", "mistral", "none"}));
  cmd->add_option("--threads", o->threads, "Compute threads (default: all cores)");
  cmd->add_option("--device", o->device, "cpu, or cuda / cuda:N (builds with the CUDA backend)");
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Running sequences at most")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Token budget of one engine step")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--kv-cache-mb", o->kv_cache_mb,
                  "KV cache size in MiB (CUDA default: what --gpu-memory-utilization leaves)")
      ->check(CLI::Range(1, 1 << 24))
      ->each([o](const std::string&) { o->kv_cache_mb_set = true; });
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "CUDA: fraction of the device memory for weights, step buffers and the KV cache")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_flag("--enforce-eager", o->enforce_eager, "CUDA: run decode steps eagerly (no CUDA graphs)");
  cmd->add_flag("--no-async-scheduling", o->no_async_scheduling,
                "Wait for each step before scheduling the next (no overlap of host work with the device)");
  cmd->add_option("--dtype", o->dtype,
                  "Compute dtype: auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16, float16 (CUDA)");
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype, "KV page dtype: auto (the compute dtype), float32, "
                                                          "bfloat16, float16");
  cmd->add_option("--load-format", o->load_format,
                  "auto, or dummy: random weights from a config (--model: a bundled name such as llama-3-8b, "
                  "a config.json or a folder with one)");
  cmd->add_option("--tokenizer", o->tokenizer, "Tokenizer to use instead of the model's (a folder, "
                                               "tokenizer.json or .gguf)");
  cmd->add_option("--swap-space-mb", o->swap_space_mb,
                  "Host memory in MiB for swapping preempted requests' KV pages (0: recompute instead)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--block-size", o->block_size, "Tokens per KV page")->check(CLI::Range(1, 1024));
  cmd->add_flag("--no-prefix-caching", o->no_prefix_caching, "Disable prefix caching");
  cmd->add_flag("--quantize-activations", o->quantize_activations,
                "CPU: 8-bit activations in matmuls with Q8_0/Q4_0/Q4_1 weights (faster, not bit-exact)");
  cmd->add_option("--max-model-len", o->max_model_len, "Context length (0: the model's own)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o->seed, "Base seed of unseeded requests");
  cmd->callback([o] { exit_code() = run_serve(*o); });
}

}  // namespace osprey::cli
