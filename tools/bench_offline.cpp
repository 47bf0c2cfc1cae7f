#include "bench_offline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/metrics.h"
#include "bench/profile_table.h"
#include "bench/report.h"
#include "bench/workload.h"
#include "osprey/engine.h"
#include "osprey/text.h"

namespace osprey {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

// One run: a RequestRecord per request (times in seconds from the run's start).
struct RunResult {
  double wall_s = 0;
  int64_t generated = 0;
  std::vector<bench::RequestRecord> records;
  double tokens_per_s() const { return wall_s > 0 ? static_cast<double>(generated) / wall_s : 0; }
  double mean_ttft_ms() const { return 1000 * bench::summarize(bench::ttft_samples(records)).mean; }
  // Mean over requests of (last token - first token) / (tokens - 1).
  double mean_tpot_ms() const { return 1000 * bench::summarize(bench::tpot_samples(records)).mean; }
};

// Submits all prompts at once and waits for all of them. Each output of a
// request's stream is timestamped when the engine hands it over (the callback).
RunResult run_requests(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  RunResult rr;
  rr.records.resize(prompts.size());
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  const auto t0 = Clock::now();
  std::vector<std::shared_ptr<RequestStream>> keep;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt_token_ids = prompts[i];
    r.params.temperature = 0.0f;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    bench::RequestRecord* t = &rr.records[i];
    t->prompt_tokens = static_cast<int>(prompts[i].size());
    t->expected_output_tokens = max_tokens;
    t->chunk_s.reserve(static_cast<size_t>(max_tokens) + 1);
    t->send_s = seconds_since(t0, Clock::now());
    auto s = engine.submit(r, [&, t](const RequestOutput& out) {
      const double now = seconds_since(t0, Clock::now());
      std::lock_guard<std::mutex> lock(mu);
      int n = 0;
      for (auto& o : out.outputs) n += static_cast<int>(o.token_ids.size());
      if (n > 0) {
        if (t->chunk_s.empty()) t->first_token_s = now;
        t->chunk_s.push_back(now);
        t->output_tokens += n;
      }
      if (out.finished) {
        t->end_s = now;
        t->usage_reported = true;
        if (!out.error.ok()) {
          t->error = bench::ErrorKind::kOther;
          t->error_message = out.error.to_string();
        }
        ++done;
        cv.notify_all();
      }
    });
    if (!s.ok()) {
      std::fprintf(stderr, "submit failed: %s\n", s.status().to_string().c_str());
      std::lock_guard<std::mutex> lock(mu);
      t->error = bench::ErrorKind::kOther;
      t->error_message = s.status().to_string();
      t->end_s = t->send_s;
      ++done;
      continue;
    }
    keep.push_back(*s);
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == prompts.size(); });
  rr.wall_s = seconds_since(t0, Clock::now());
  for (auto& t : rr.records) rr.generated += t.output_tokens;
  return rr;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
  // Ids away from the ends of the vocabulary, where special tokens usually live.
  std::uniform_int_distribution<int> d(std::min(1000, vocab / 4), std::max(vocab - 1000, vocab / 2));
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Per decode-only step between two stats snapshots: host time (schedule,
// batch build, sampling + update, loop) against the executor's forward.
nlohmann::json print_step_timing(const char* label, const EngineStats& a, const EngineStats& b) {
  const int64_t steps = b.num_decode_steps - a.num_decode_steps;
  if (steps <= 0) return nullptr;
  const double us = 1e-3 / static_cast<double>(steps);
  const double sched = (b.decode_schedule_ns - a.decode_schedule_ns) * us;
  const double build = (b.decode_build_ns - a.decode_build_ns) * us;
  const double fwd = (b.decode_forward_ns - a.decode_forward_ns) * us;
  const double upd = (b.decode_update_ns - a.decode_update_ns) * us;
  const double smp = (b.decode_sample_ns - a.decode_sample_ns) * us;
  const double loop = (b.decode_loop_ns - a.decode_loop_ns) * us;
  const double host = sched + build + upd + loop;
  const double batch = static_cast<double>(b.decode_tokens - a.decode_tokens) / static_cast<double>(steps);
  std::printf("  decode step (%s): %lld steps, %.1f seqs/step; per step: forward %.1f us, host %.1f us "
              "(schedule %.1f, build %.1f, sample+update %.1f [sampler %.1f], loop %.1f) = %.2f%% of the step\n",
              label, static_cast<long long>(steps), batch, fwd, host, sched, build, upd, smp, loop,
              100.0 * host / (host + fwd));
  // Device time per decode step against the loop's wall time per step (with
  // async scheduling "forward" is only the time the loop waited).
  const int64_t timed = b.num_timed_decode_steps - a.num_timed_decode_steps;
  const double device = timed > 0 ? 1e-3 * static_cast<double>(b.decode_device_ns - a.decode_device_ns) /
                                        static_cast<double>(timed)
                                  : -1.0;
  const long long overlapped = static_cast<long long>(b.num_overlapped_steps - a.num_overlapped_steps);
  if (device >= 0)
    std::printf("  decode device time %.1f us per step: GPU busy %.1f%% of the loop's time; %lld steps overlapped\n",
                device, 100.0 * device / (host + fwd), overlapped);
  return {{"decode_steps", steps}, {"seqs_per_step", batch}, {"forward_us", fwd}, {"host_us", host},
          {"schedule_us", sched}, {"build_us", build}, {"sample_update_us", upd}, {"sampler_us", smp}, {"loop_us", loop},
          {"device_us", device}, {"overlapped_steps", overlapped}};
}

}  // namespace

namespace {

// Prompts of input_len tokens: text built with the model's tokenizer, or
// random ids when asked (or when the model has none).
std::vector<std::vector<int32_t>> make_prompts(const BenchOfflineOptions& o, Engine& engine, std::mt19937& rng,
                                               int count, bool* used_text) {
  const int vocab = engine.model_info().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  *used_text = false;
  std::shared_ptr<const TextProcessor> text = o.random_prompts ? nullptr : engine.text();
  if (text) {
    auto builder = bench::PromptBuilder::create(text, /*count_special_tokens=*/true);
    if (builder.ok()) {
      std::mt19937_64 rng64(rng());
      for (int i = 0; i < count; ++i) {
        int got = 0;
        auto ids = text->encode((*builder)->make_text(rng64, o.input_len, "", &got), true);
        if (static_cast<int>(ids.size()) > o.input_len) ids.resize(static_cast<size_t>(o.input_len));
        prompts.push_back(std::move(ids));
      }
      *used_text = true;
      return prompts;
    }
  }
  for (int i = 0; i < count; ++i) prompts.push_back(random_tokens(rng, o.input_len, vocab));
  return prompts;
}

}  // namespace

Expected<EngineConfig> bench_offline_engine_config(const BenchOfflineOptions& o) {
  OSP_ASSIGN_OR_RETURN(EngineConfig cfg, cli::resolve_engine_config(o.engine));
  if (o.engine.max_num_seqs <= 0) cfg.max_num_seqs = std::max(o.num_requests, 1);
  return cfg;
}

int run_bench_offline(const BenchOfflineOptions& o, const EngineConfig& config) {
  auto slo = bench::parse_slo(o.slo);
  if (!slo.ok()) {
    std::fprintf(stderr, "error: --slo: %s\n", slo.status().message().c_str());
    return 2;
  }
  EngineConfig cfg = config;
  nlohmann::json report;
  report["model"] = cfg.model_path;
  report["device"] = cfg.device;
  std::mt19937 rng(static_cast<uint32_t>(o.seed));

  if (o.mode == "throughput" || o.mode == "all") {
    cfg.enable_prefix_caching = false;  // measure compute, not reuse
    cfg.profile = o.profile;
    auto engine = Engine::create(cfg);
    cfg.profile = false;  // the prefix mode's engine runs unprofiled
    if (!engine.ok()) {
      std::fprintf(stderr, "error: %s\n", engine.status().to_string().c_str());
      return 1;
    }
    bool used_text = false;
    std::vector<std::vector<int32_t>> prompts = make_prompts(o, **engine, rng, o.num_requests, &used_text);
    // Warm-up: one short request (page faults, thread start).
    run_requests(**engine, {prompts[0]}, 2);
    RunResult seq;
    (*engine)->reset_profile();  // the warm-up's ops out
    const EngineStats st0 = (*engine)->stats();
    const auto t0 = Clock::now();
    for (int i = 0; i < std::min(o.num_sequential, o.num_requests); ++i) {
      const double offset = seconds_since(t0, Clock::now());
      RunResult one = run_requests(**engine, {prompts[i]}, o.output_len);
      seq.generated += one.generated;
      bench::RequestRecord r = std::move(one.records[0]);
      // One timeline for the sequential requests (for the duration and throughput).
      r.send_s += offset;
      r.end_s += offset;
      if (r.first_token_s >= 0) r.first_token_s += offset;
      for (auto& x : r.chunk_s) x += offset;
      seq.records.push_back(std::move(r));
    }
    seq.wall_s = seconds_since(t0, Clock::now());
    const EngineStats st1 = (*engine)->stats();
    const ProfileReport prof_seq = (*engine)->profile();
    (*engine)->reset_profile();
    RunResult conc = run_requests(**engine, prompts, o.output_len);
    const EngineStats st2 = (*engine)->stats();
    const ProfileReport prof_conc = (*engine)->profile();
    std::printf("throughput: input %d, output %d tokens, %d concurrent requests (%s prompts)\n", o.input_len,
                o.output_len, o.num_requests, used_text ? "text" : "random-id");
    std::printf("  %-14s %12s %12s %12s\n", "", "tokens/s", "TTFT ms", "TPOT ms");
    std::printf("  %-14s %12.1f %12.1f %12.2f\n", "one at a time", seq.tokens_per_s(), seq.mean_ttft_ms(),
                seq.mean_tpot_ms());
    std::printf("  %-14s %12.1f %12.1f %12.2f\n", "concurrent", conc.tokens_per_s(), conc.mean_ttft_ms(),
                conc.mean_tpot_ms());
    const double speedup = seq.tokens_per_s() > 0 ? conc.tokens_per_s() / seq.tokens_per_s() : 0;
    std::printf("  speedup %.2fx\n", speedup);
    nlohmann::json timing_seq = print_step_timing("one at a time", st0, st1);
    nlohmann::json timing_conc = print_step_timing("concurrent", st1, st2);
    const bench::RunMetrics m_seq = bench::compute_metrics(seq.records, *slo);
    const bench::RunMetrics m_conc = bench::compute_metrics(conc.records, *slo);
    if (!seq.records.empty()) bench::print_summary(stdout, "Offline benchmark: one at a time", m_seq);
    bench::print_summary(stdout, "Offline benchmark: concurrent", m_conc);
    if (o.profile) {
      std::printf("\none at a time: %s\nconcurrent: %s", bench::format_profile_table(prof_seq).c_str(),
                  bench::format_profile_table(prof_conc).c_str());
      std::printf("(profiled runs are eager and slower: time every op, not the throughput)\n");
      report["profile"] = {{"sequential", nlohmann::json::parse(bench::profile_to_json(prof_seq).dump())},
                           {"concurrent", nlohmann::json::parse(bench::profile_to_json(prof_conc).dump())}};
    }
    auto to_json = [](const bench::RunMetrics& m) { return nlohmann::json::parse(bench::metrics_to_json(m).dump()); };
    report["throughput"] = {{"input_len", o.input_len},
                            {"output_len", o.output_len},
                            {"num_requests", o.num_requests},
                            {"prompts", used_text ? "text" : "random_ids"},
                            {"sequential", {{"tokens_per_s", seq.tokens_per_s()},
                                            {"ttft_ms", seq.mean_ttft_ms()},
                                            {"tpot_ms", seq.mean_tpot_ms()},
                                            {"metrics", to_json(m_seq)}}},
                            {"concurrent", {{"tokens_per_s", conc.tokens_per_s()},
                                            {"ttft_ms", conc.mean_ttft_ms()},
                                            {"tpot_ms", conc.mean_tpot_ms()},
                                            {"metrics", to_json(m_conc)}}},
                            {"speedup", speedup},
                            {"decode_step_timing", {{"sequential", timing_seq}, {"concurrent", timing_conc}}}};
  }

  if (o.mode == "prefix" || o.mode == "all") {
    cfg.enable_prefix_caching = config.enable_prefix_caching;  // !--no-prefix-caching
    auto engine = Engine::create(cfg);
    if (!engine.ok()) {
      std::fprintf(stderr, "error: %s\n", engine.status().to_string().c_str());
      return 1;
    }
    const int vocab = (*engine)->model_info().vocab_size;
    run_requests(**engine, {random_tokens(rng, 16, vocab)}, 2);  // warm-up
    double cold_ms = 0, warm_ms = 0;
    for (int trial = 0; trial < o.prefix_trials; ++trial) {
      auto prefix = random_tokens(rng, o.shared_prefix_len, vocab);
      auto make = [&] {
        auto p = prefix;
        auto s = random_tokens(rng, o.suffix_len, vocab);
        p.insert(p.end(), s.begin(), s.end());
        return p;
      };
      RunResult cold = run_requests(**engine, {make()}, 1);  // a new prefix: nothing cached
      RunResult warm = run_requests(**engine, {make()}, 1);  // same prefix, new suffix
      cold_ms += cold.mean_ttft_ms();
      warm_ms += warm.mean_ttft_ms();
    }
    cold_ms /= std::max(1, o.prefix_trials);
    warm_ms /= std::max(1, o.prefix_trials);
    const EngineStats st = (*engine)->stats();
    std::printf("prefix cache: %d-token shared prefix + %d-token suffix, %d trials\n", o.shared_prefix_len,
                o.suffix_len, o.prefix_trials);
    std::printf("  TTFT cold %.1f ms, warm %.1f ms: %.2fx; hit rate %.1f%%\n", cold_ms, warm_ms,
                warm_ms > 0 ? cold_ms / warm_ms : 0.0, 100 * st.prefix_hit_rate);
    report["prefix"] = {{"shared_prefix_len", o.shared_prefix_len},
                        {"suffix_len", o.suffix_len},
                        {"ttft_cold_ms", cold_ms},
                        {"ttft_warm_ms", warm_ms},
                        {"speedup", warm_ms > 0 ? cold_ms / warm_ms : 0.0},
                        {"hit_rate", st.prefix_hit_rate}};
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    if (!f) {
      std::fprintf(stderr, "error: cannot write %s\n", o.json_path.c_str());
      return 1;
    }
    f << report.dump(2) << "\n";
  }
  return 0;
}

}  // namespace osprey
