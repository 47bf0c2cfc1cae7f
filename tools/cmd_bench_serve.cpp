// osprey bench serve: load generator for any OpenAI-compatible server
// (tools/bench/serve_runner.h); osprey bench mock-server: a streaming mock to
// measure the client itself. Flags follow vLLM's benchmark_serving names.
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench/arrival.h"
#include "bench/mock_server.h"
#include "bench/serve_runner.h"
#include "commands.h"
#include "osprey/text.h"

namespace osprey::cli {

namespace {

// Thousands of streams need thousands of sockets: raise the soft fd limit.
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

struct ServeCli {
  bench::ServeOptions o;
  std::string request_rate = "inf";
  std::string max_concurrency;
  std::string tokenizer;  // "" : --model when it is a local path or "default"
  bool no_tokenizer = false;
  bool no_ignore_eos = false;
  bool no_progress = false;
  std::string extra_body;
  std::string served_name;  // "" : --model
};

volatile std::sig_atomic_t g_stop = 0;

}  // namespace

void add_bench_serve_commands(CLI::App& bench) {
  auto c = std::make_shared<ServeCli>();
  auto& o = c->o;
  auto& w = o.workload;
  auto* cmd = bench.add_subcommand("serve", "Load generator for an OpenAI-compatible server (see docs/bench.md)");
  cmd->add_option("--base-url", o.base_url, "Server URL, http://host:port[/prefix]")->capture_default_str();
  cmd->add_option("--endpoint", o.endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
  cmd->add_option("--model", o.model, "Model name sent in requests (also the tokenizer when it is a local path or 'default')")
      ->required();
  cmd->add_option("--served-model-name", c->served_name, "Model name sent in requests, when --model is a path");
  cmd->add_option("--api-key", o.api_key, "Sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)");
  cmd->add_option("--tokenizer", c->tokenizer, "Tokenizer for exact-length prompts: a path or 'default'");
  cmd->add_flag("--no-tokenizer", c->no_tokenizer, "Send token-id prompts (/v1/completions only)");
  cmd->add_option("--dataset-name", w.dataset, "random | sharegpt | prefix | multi-turn")
      ->check(CLI::IsMember({"random", "sharegpt", "prefix", "multi-turn"}))
      ->capture_default_str();
  cmd->add_option("--dataset-path", w.dataset_path, "ShareGPT JSON file (implies --dataset-name sharegpt)");
  cmd->add_option("--num-prompts", w.num_prompts, "Requests (conversations) per run")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  cmd->add_option("--input-len", w.input_len, "Prompt tokens (mean for random lengths)")
      ->check(CLI::Range(1, 1 << 22))
      ->capture_default_str();
  cmd->add_option("--output-len", w.output_len, "Output tokens (mean for random lengths)")
      ->check(CLI::Range(1, 1 << 22))
      ->capture_default_str();
  cmd->add_option("--dist", w.dist, "Length distribution: uniform | normal | lognormal")
      ->check(CLI::IsMember({"uniform", "normal", "lognormal"}))
      ->capture_default_str();
  cmd->add_option("--random-range-ratio", w.range_ratio, "uniform: lengths in [mean(1-r), mean(1+r)]")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--input-std", w.input_std, "normal / lognormal: prompt length standard deviation (tokens)");
  cmd->add_option("--output-std", w.output_std, "normal / lognormal: output length standard deviation (tokens)");
  cmd->add_option("--num-prefix-groups", w.num_prefix_groups, "prefix: groups sharing a system prompt")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--prefix-len", w.prefix_len, "prefix: system prompt tokens")
      ->check(CLI::Range(1, 1 << 22))
      ->capture_default_str();
  cmd->add_option("--num-turns", w.num_turns, "multi-turn: turns per conversation")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--sharegpt-output-len", w.sharegpt_output_len, "sharegpt: override the answer lengths");
  cmd->add_option("--seed", w.seed, "Seed of prompts, lengths and arrivals")->capture_default_str();
  cmd->add_option("--request-rate", c->request_rate, "Requests/s, a list for a sweep (1,2,4,inf); inf: all at once")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", c->max_concurrency, "Requests in flight at most; a list for a sweep (1,8,32)");
  cmd->add_option("--arrival", o.arrival.kind, "poisson | constant | burst")
      ->check(CLI::IsMember({"poisson", "constant", "burst"}))
      ->capture_default_str();
  cmd->add_option("--burst-size", o.arrival.burst_size, "burst: requests per burst")->check(CLI::Range(1, 10000000));
  cmd->add_option("--burst-interval", o.arrival.burst_interval_s, "burst: seconds between bursts")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--num-warmups", o.num_warmups, "Warm-up requests before the runs (not measured)")
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--timeout", o.timeout_s, "Per-request timeout, seconds")->check(CLI::Range(0.001, 1e7))
      ->capture_default_str();
  cmd->add_flag("--no-ignore-eos", c->no_ignore_eos, "Do not send ignore_eos (for servers that reject it)");
  cmd->add_option("--temperature", o.temperature, "Sampling temperature sent")->capture_default_str();
  cmd->add_option("--extra-body", c->extra_body, "JSON object merged into every request body");
  cmd->add_option("--slo", o.slo, "Goodput SLOs, e.g. ttft=200ms,tpot=50ms[,e2e=2s]");
  cmd->add_option("--output-json", o.output_json, "Write the results as JSON");
  cmd->add_option("--output-csv", o.output_csv, "Write one CSV row per run");
  cmd->add_option("--plot-dir", o.plot_dir, "Write SVG charts (latency CDFs, sweep curves) here");
  cmd->add_flag("--save-detailed", o.save_detailed, "Per-request lengths and latencies in the JSON");
  cmd->add_flag("--progress", o.progress, "Live progress line on stderr (default: when stderr is a tty)");
  cmd->add_flag("--no-progress", c->no_progress, "No progress line");
  cmd->add_option("--io-threads", o.num_io_threads, "Client I/O threads")->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->callback([c] {
    raise_fd_limit();
    bench::ServeOptions o = c->o;
    if (o.api_key.empty())
      if (const char* k = std::getenv("OPENAI_API_KEY")) o.api_key = k;
    if (!o.workload.dataset_path.empty() && o.workload.dataset == "random") o.workload.dataset = "sharegpt";
    o.ignore_eos = !c->no_ignore_eos;
    if (!c->no_progress && !o.progress) o.progress = isatty(2) != 0;
    if (c->no_progress) o.progress = false;
    const bool chat = o.endpoint.find("chat") != std::string::npos;
    o.workload.count_special_tokens = !chat;
    auto rates = bench::parse_number_list(c->request_rate);
    if (!rates.ok()) {
      std::fprintf(stderr, "osprey bench serve: --request-rate: %s\n", rates.status().message().c_str());
      exit_code() = 2;
      return;
    }
    o.request_rates = *rates;
    if (!c->max_concurrency.empty()) {
      auto conc = bench::parse_number_list(c->max_concurrency);
      if (!conc.ok()) {
        std::fprintf(stderr, "osprey bench serve: --max-concurrency: %s\n", conc.status().message().c_str());
        exit_code() = 2;
        return;
      }
      o.max_concurrencies.clear();
      for (double v : *conc) o.max_concurrencies.push_back(std::isinf(v) ? 0 : static_cast<int>(v));
    }
    if (!c->extra_body.empty()) {
      o.extra_body = nlohmann::json::parse(c->extra_body, nullptr, false);
      if (!o.extra_body.is_object()) {
        std::fprintf(stderr, "osprey bench serve: --extra-body must be a JSON object\n");
        exit_code() = 2;
        return;
      }
    }
    // The tokenizer: --tokenizer, else --model when it names a local path or "default".
    std::shared_ptr<const TextProcessor> text;
    std::string tok = c->tokenizer;
    if (tok.empty() && (c->o.model == "default" || std::filesystem::exists(c->o.model))) tok = c->o.model;
    if (!c->no_tokenizer && !tok.empty()) {
      auto t = TextProcessor::open(tok);
      if (!t.ok()) {
        std::fprintf(stderr, "osprey bench serve: tokenizer %s: %s\n", tok.c_str(), t.status().to_string().c_str());
        exit_code() = 2;
        return;
      }
      text = std::shared_ptr<const TextProcessor>(std::move(t).value());
    }
    if (!text && chat && o.workload.dataset == "random") {
      std::fprintf(stderr, "osprey bench serve: the chat endpoint needs text prompts: give --tokenizer\n");
      exit_code() = 2;
      return;
    }
    if (!text && o.workload.dataset == "random")
      std::fprintf(stderr, "osprey bench serve: no tokenizer; sending token-id prompts\n");
    if (!c->served_name.empty()) o.model = c->served_name;
    exit_code() = bench::run_bench_serve(o, text);
  });

  auto mo = std::make_shared<bench::MockServerOptions>();
  mo->port = 8001;
  auto duration = std::make_shared<double>(0);
  auto* mock = bench.add_subcommand("mock-server",
                                    "Streaming mock of an OpenAI server, to measure the bench client (docs/bench.md)");
  mock->add_option("--host", mo->host, "Address to listen on")->capture_default_str();
  mock->add_option("--port", mo->port, "Port (0: any)")->capture_default_str();
  mock->add_option("--io-threads", mo->num_io_threads, "I/O threads")->capture_default_str();
  mock->add_option("--token-delay-us", mo->token_delay_us, "Microseconds between token chunks (0: as fast as possible)")
      ->capture_default_str();
  mock->add_option("--duration", *duration, "Stop after this many seconds (0: until SIGINT/SIGTERM)");
  mock->callback([mo, duration] {
    raise_fd_limit();
    bench::MockServer server(*mo);
    if (auto s = server.start(); !s.ok()) {
      std::fprintf(stderr, "osprey bench mock-server: %s\n", s.to_string().c_str());
      exit_code() = 1;
      return;
    }
    std::fprintf(stderr, "mock server on %s:%d\n", mo->host.c_str(), server.port());
    std::signal(SIGINT, [](int) { g_stop = 1; });
    std::signal(SIGTERM, [](int) { g_stop = 1; });
    const auto t0 = std::chrono::steady_clock::now();
    while (!g_stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (*duration > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > *duration) break;
    }
    const auto n = server.counters();
    server.stop();
    std::fprintf(stderr, "mock server: %lld requests, %lld chunks\n", static_cast<long long>(n.requests),
                 static_cast<long long>(n.chunks));
  });
}

}  // namespace osprey::cli
