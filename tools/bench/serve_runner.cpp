#include "bench/serve_runner.h"

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>

#include "bench/report.h"
#include "bench/svg_chart.h"

namespace osprey::bench {

nlohmann::json request_body(const ServeOptions& o, const Conversation& c, size_t turn,
                            const std::vector<std::string>& answers) {
  nlohmann::json b = nlohmann::json::object();
  b["model"] = o.model;
  const bool chat = o.endpoint.find("chat") != std::string::npos;
  const Turn& t = c.turns[turn];
  if (chat) {
    nlohmann::json msgs = nlohmann::json::array();
    if (!c.system.empty()) msgs.push_back({{"role", "system"}, {"content", c.system}});
    for (size_t k = 0; k < turn; ++k) {
      msgs.push_back({{"role", "user"}, {"content", c.turns[k].text}});
      msgs.push_back({{"role", "assistant"}, {"content", k < answers.size() ? answers[k] : std::string()}});
    }
    msgs.push_back({{"role", "user"}, {"content", t.text}});
    b["messages"] = std::move(msgs);
  } else if (!t.token_ids.empty()) {
    b["prompt"] = t.token_ids;
  } else {
    std::string p = c.system;
    for (size_t k = 0; k < turn; ++k) {
      p += c.turns[k].text;
      if (k < answers.size()) p += answers[k];
    }
    p += t.text;
    b["prompt"] = std::move(p);
  }
  b["max_tokens"] = t.output_tokens;
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  b["temperature"] = o.temperature;
  if (o.ignore_eos) b["ignore_eos"] = true;
  for (auto it = o.extra_body.begin(); it != o.extra_body.end(); ++it) b[it.key()] = it.value();
  return b;
}

namespace {

// Shared state of one run; every field under mu.
struct RunState {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<size_t> ready;        // due conversations waiting for a slot
  size_t next_arrival = 0;
  int in_flight = 0;               // conversations started, not finished
  int active = 0;                  // callbacks running on I/O threads (the run ends when 0)
  size_t conversations_done = 0;
  std::vector<std::vector<std::string>> answers;  // per conversation, multi-turn only
  std::vector<RequestRecord> records;
  int64_t errors = 0, output_tokens = 0;
};

}  // namespace

std::vector<RequestRecord> run_conversations(StreamClient& client, const ServeOptions& o,
                                             const std::vector<Conversation>& convs,
                                             const std::vector<double>& arrivals, int max_concurrency,
                                             const std::string& progress_label) {
  auto st = std::make_shared<RunState>();
  st->answers.resize(convs.size());
  size_t num_turns = 0;
  for (const auto& c : convs) num_turns += c.turns.size();
  st->records.reserve(num_turns);
  if (convs.empty()) return {};
  const double t0 = client.now();

  // send_turn and launch_ready are called with st->mu held and return the sends
  // to make once it is released.
  struct Send {
    size_t conv, turn;
  };
  std::function<void(Send)> send_turn;
  auto launch_ready = [&, st](std::vector<Send>& out) {
    while (!st->ready.empty() && (max_concurrency <= 0 || st->in_flight < max_concurrency)) {
      out.push_back({st->ready.front(), 0});
      st->ready.pop_front();
      ++st->in_flight;
    }
  };
  send_turn = [&, st](Send s) {
    const Conversation& c = convs[s.conv];
    std::vector<std::string> answers;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      answers = st->answers[s.conv];
    }
    RequestRecord r;
    r.expected_output_tokens = c.turns[s.turn].output_tokens;
    r.prompt_tokens = c.system_tokens;
    for (size_t k = 0; k <= s.turn; ++k) r.prompt_tokens += c.turns[k].input_tokens;
    for (size_t k = 0; k < s.turn; ++k) r.prompt_tokens += c.turns[k].output_tokens;
    const bool keep_text = s.turn + 1 < c.turns.size();
    client.send(request_body(o, c, s.turn, answers).dump(), std::move(r), keep_text,
                [&, st, s](RequestRecord&& rec, std::string&& text) {
                  std::vector<Send> sends;
                  {
                    std::lock_guard<std::mutex> lock(st->mu);
                    ++st->active;
                    const bool ok = rec.ok();
                    if (!ok) ++st->errors;
                    st->output_tokens += rec.output_tokens;
                    st->records.push_back(std::move(rec));
                    if (ok && s.turn + 1 < convs[s.conv].turns.size()) {
                      st->answers[s.conv].push_back(std::move(text));
                      sends.push_back({s.conv, s.turn + 1});
                    } else {
                      --st->in_flight;
                      ++st->conversations_done;
                      launch_ready(sends);
                      if (st->conversations_done == convs.size()) st->cv.notify_all();
                    }
                  }
                  for (auto& x : sends) send_turn(x);
                  std::lock_guard<std::mutex> lock(st->mu);
                  if (--st->active == 0) st->cv.notify_all();
                });
  };
  // Arrivals: a chain of timers, each moving every due conversation to `ready`.
  std::function<void()> on_arrival;
  on_arrival = [&, st]() {
    std::vector<Send> sends;
    double next_due = -1;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      ++st->active;
      const double now = client.now() - t0;
      while (st->next_arrival < convs.size() && arrivals[st->next_arrival] <= now + 1e-6)
        st->ready.push_back(st->next_arrival++);
      launch_ready(sends);
      if (st->next_arrival < convs.size()) next_due = arrivals[st->next_arrival] - now;
    }
    for (auto& x : sends) send_turn(x);
    if (next_due >= 0) client.post_after(next_due, on_arrival);
    std::lock_guard<std::mutex> lock(st->mu);
    if (--st->active == 0) st->cv.notify_all();
  };
  client.post_after(0, on_arrival);

  std::unique_lock<std::mutex> lock(st->mu);
  const bool tty = o.progress;
  while (st->conversations_done < convs.size() || st->active > 0) {
    st->cv.wait_for(lock, std::chrono::milliseconds(500));
    if (tty) {
      const double el = client.now() - t0;
      std::fprintf(stderr, "\r%s: %zu/%zu done, %d in flight, %lld errors, %.1f s, %.1f out tok/s   ",
                   progress_label.c_str(), st->conversations_done, convs.size(), st->in_flight,
                   static_cast<long long>(st->errors), el, el > 0 ? static_cast<double>(st->output_tokens) / el : 0.0);
      std::fflush(stderr);
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  // Every callback has run (done == size); the timer chain has ended. Shift
  // the timeline so that the run starts at 0.
  std::vector<RequestRecord> out = std::move(st->records);
  lock.unlock();
  for (auto& r : out) {
    r.send_s -= t0;
    r.end_s -= t0;
    if (r.first_token_s >= 0) r.first_token_s -= t0;
    for (auto& x : r.chunk_s) x -= t0;
  }
  return out;
}

namespace {

std::string rate_label(double r) {
  if (!(r > 0) || std::isinf(r)) return "inf";
  char b[32];
  std::snprintf(b, sizeof b, "%g", r);
  return b;
}

std::string run_label(const RunResult& r) {
  std::string s = "rate=" + rate_label(r.request_rate);
  if (r.max_concurrency > 0) s += " conc=" + std::to_string(r.max_concurrency);
  return s;
}

nlohmann::ordered_json detailed(const std::vector<RequestRecord>& recs) {
  nlohmann::ordered_json d;
  std::vector<double> ttft, e2e;
  std::vector<int> in, out;
  std::vector<std::vector<double>> itl;
  std::vector<std::string> errs;
  for (const auto& r : recs) {
    ttft.push_back(r.first_token_s >= 0 ? (r.first_token_s - r.send_s) * 1e3 : -1);
    e2e.push_back((r.end_s - r.send_s) * 1e3);
    in.push_back(r.prompt_tokens);
    out.push_back(r.output_tokens);
    std::vector<double> g;
    for (size_t i = 1; i < r.chunk_s.size(); ++i) g.push_back((r.chunk_s[i] - r.chunk_s[i - 1]) * 1e3);
    itl.push_back(std::move(g));
    errs.push_back(r.ok() ? "" : r.error_message);
  }
  d["input_lens"] = in;
  d["output_lens"] = out;
  d["ttfts_ms"] = ttft;
  d["e2els_ms"] = e2e;
  d["itls_ms"] = itl;
  d["errors"] = errs;
  return d;
}

bool write_file(const std::string& path, const std::string& text) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream f(path, std::ios::binary);
  if (!f) return false;
  f << text;
  return static_cast<bool>(f);
}

void write_charts(const std::string& dir, const std::vector<RunResult>& runs, bool sweep_concurrency) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (const char* which : {"ttft", "itl"}) {
    std::vector<ChartSeries> series;
    for (const auto& r : runs) {
      auto samples = std::string(which) == "ttft" ? ttft_samples(r.records) : itl_samples(r.records);
      for (auto& x : samples) x *= 1e3;
      auto [xs, ys] = cdf_points(std::move(samples));
      series.push_back({run_label(r), std::move(xs), std::move(ys)});
    }
    ChartSpec spec;
    spec.title = std::string(which) == "ttft" ? "TTFT CDF" : "ITL CDF";
    spec.x_label = std::string(which) == "ttft" ? "time to first token (ms)" : "inter-token latency (ms)";
    spec.y_label = "fraction of samples";
    write_file(dir + "/" + which + "_cdf.svg", render_line_chart(spec, series));
  }
  if (runs.size() < 2) return;
  ChartSpec load;
  for (const auto& r : runs)
    load.x_category.push_back(sweep_concurrency ? std::to_string(r.max_concurrency) : rate_label(r.request_rate));
  load.x_label = sweep_concurrency ? "max concurrency" : "request rate (req/s)";
  ChartSeries tput{"output tok/s", {}, {}}, treq{"requests/s x100", {}, {}};
  ChartSeries ttft{"p99 TTFT", {}, {}}, itl{"p99 ITL", {}, {}}, tpot{"p99 TPOT", {}, {}}, e2e{"p99 E2E", {}, {}};
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& m = runs[i].metrics;
    const double x = static_cast<double>(i);
    tput.x.push_back(x), tput.y.push_back(m.output_throughput);
    treq.x.push_back(x), treq.y.push_back(m.request_throughput * 100);
    ttft.x.push_back(x), ttft.y.push_back(m.ttft_s.p99 * 1e3);
    itl.x.push_back(x), itl.y.push_back(m.itl_s.p99 * 1e3);
    tpot.x.push_back(x), tpot.y.push_back(m.tpot_s.p99 * 1e3);
    e2e.x.push_back(x), e2e.y.push_back(m.e2e_s.p99 * 1e3);
  }
  load.title = "Throughput against load";
  load.y_label = "throughput";
  write_file(dir + "/sweep_throughput.svg", render_line_chart(load, {tput, treq}));
  load.title = "Tail latency against load";
  load.y_label = "p99 latency (ms)";
  write_file(dir + "/sweep_p99_latency.svg", render_line_chart(load, {ttft, tpot, itl, e2e}));
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char b[64];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

}  // namespace

int run_bench_serve(const ServeOptions& o, std::shared_ptr<const TextProcessor> text) {
  auto slo = parse_slo(o.slo);
  if (!slo.ok()) {
    std::fprintf(stderr, "osprey bench serve: --slo: %s\n", slo.status().message().c_str());
    return 2;
  }
  auto url = parse_base_url(o.base_url);
  if (!url.ok()) {
    std::fprintf(stderr, "osprey bench serve: --base-url: %s\n", url.status().message().c_str());
    return 2;
  }
  auto builder = PromptBuilder::create(text, o.workload.count_special_tokens);
  if (!builder.ok()) {
    std::fprintf(stderr, "osprey bench serve: %s\n", builder.status().message().c_str());
    return 2;
  }
  ClientOptions co;
  co.url = *url;
  co.path = o.endpoint;
  co.api_key = o.api_key;
  co.timeout_s = o.timeout_s;
  co.num_io_threads = o.num_io_threads;
  auto client = StreamClient::create(co);
  if (!client.ok()) {
    std::fprintf(stderr, "osprey bench serve: %s\n", client.status().message().c_str());
    return 1;
  }
  const bool sweep_concurrency = o.max_concurrencies.size() > 1 && o.request_rates.size() == 1;

  if (o.num_warmups > 0) {
    WorkloadOptions w = o.workload;
    w.num_prompts = o.num_warmups;
    w.seed = o.workload.seed ^ 0x9e3779b97f4a7c15ULL;
    auto convs = make_workload(w, **builder);
    if (!convs.ok()) {
      std::fprintf(stderr, "osprey bench serve: %s\n", convs.status().message().c_str());
      return 2;
    }
    std::vector<double> at(convs->size(), 0.0);
    auto recs = run_conversations(**client, o, *convs, at, o.max_concurrencies.front(), "warm-up");
    int failed = 0;
    for (const auto& r : recs) failed += r.ok() ? 0 : 1;
    std::fprintf(stderr, "warm-up: %zu requests, %d failed%s%s\n", recs.size(), failed,
                 failed ? "; first error: " : "", failed ? recs[0].error_message.c_str() : "");
  }

  std::vector<RunResult> runs;
  int run_index = 0;
  for (double rate : o.request_rates) {
    for (int conc : o.max_concurrencies) {
      WorkloadOptions w = o.workload;
      // A fresh seed per run: the same distribution, prompts a prefix cache has not seen.
      w.seed = o.workload.seed + static_cast<uint64_t>(run_index) * 1000003ULL;
      auto convs = make_workload(w, **builder);
      if (!convs.ok()) {
        std::fprintf(stderr, "osprey bench serve: %s\n", convs.status().message().c_str());
        return 2;
      }
      ArrivalOptions a = o.arrival;
      a.rate = rate;
      a.seed = w.seed + 17;
      auto at = arrival_times(a, static_cast<int>(convs->size()));
      if (!at.ok()) {
        std::fprintf(stderr, "osprey bench serve: %s\n", at.status().message().c_str());
        return 2;
      }
      RunResult rr;
      rr.request_rate = rate > 0 ? rate : std::numeric_limits<double>::infinity();
      rr.max_concurrency = conc;
      const std::string label = run_label(rr);
      rr.records = run_conversations(**client, o, *convs, *at, conc, label);
      // Closed loop (no arrival rate, a stream count): the sustained rate too.
      rr.metrics = compute_metrics(rr.records, *slo, std::isfinite(rate) && rate > 0 ? 0 : conc);
      print_summary(stdout, "Serving benchmark: " + label, rr.metrics);
      for (const auto& r : rr.records)
        if (!r.ok()) {
          std::printf("first error: %s\n", r.error_message.c_str());
          break;
        }
      std::fflush(stdout);
      runs.push_back(std::move(rr));
      ++run_index;
    }
  }
  std::vector<std::string> labels;
  std::vector<RunMetrics> metrics;
  std::vector<std::vector<std::string>> keys;
  for (const auto& r : runs) {
    labels.push_back(run_label(r));
    metrics.push_back(r.metrics);
    keys.push_back({rate_label(r.request_rate), std::to_string(r.max_concurrency)});
  }
  if (runs.size() > 1) print_sweep_table(stdout, labels, metrics);

  int rc = 0;
  if (!o.output_json.empty()) {
    nlohmann::ordered_json j;
    j["tool"] = "osprey bench serve";
    j["date"] = utc_now();
    j["base_url"] = o.base_url;
    j["endpoint"] = o.endpoint;
    j["model_id"] = o.model;
    const auto& w = o.workload;
    j["workload"] = {{"dataset_name", w.dataset}, {"num_prompts", w.num_prompts}, {"seed", w.seed},
                     {"input_len", w.input_len}, {"output_len", w.output_len}, {"dist", w.dist},
                     {"random_range_ratio", w.range_ratio}, {"input_std", w.input_std}, {"output_std", w.output_std},
                     {"dataset_path", w.dataset_path}, {"tokenizer", builder.value()->has_tokenizer()}};
    if (w.dataset == "prefix") j["workload"]["num_prefix_groups"] = w.num_prefix_groups, j["workload"]["prefix_len"] = w.prefix_len;
    if (w.dataset == "multi-turn") j["workload"]["num_turns"] = w.num_turns;
    j["arrival"] = {{"kind", o.arrival.kind}, {"burst_size", o.arrival.burst_size},
                    {"burst_interval", o.arrival.burst_interval_s}};
    j["num_warmups"] = o.num_warmups;
    j["ignore_eos"] = o.ignore_eos;
    j["slo"] = o.slo;
    j["runs"] = nlohmann::ordered_json::array();
    for (const auto& r : runs) {
      nlohmann::ordered_json x;
      x["request_rate"] = std::isinf(r.request_rate) ? nlohmann::ordered_json("inf") : nlohmann::ordered_json(r.request_rate);
      x["max_concurrency"] = r.max_concurrency;
      const nlohmann::ordered_json mj = metrics_to_json(r.metrics);
      for (auto it = mj.begin(); it != mj.end(); ++it) x[it.key()] = it.value();
      if (o.save_detailed) x["detailed"] = detailed(r.records);
      j["runs"].push_back(std::move(x));
    }
    if (!write_file(o.output_json, j.dump(2) + "\n")) {
      std::fprintf(stderr, "osprey bench serve: cannot write %s\n", o.output_json.c_str());
      rc = 1;
    }
  }
  if (!o.output_csv.empty() && !write_file(o.output_csv, metrics_csv({"request_rate", "max_concurrency"}, keys, metrics))) {
    std::fprintf(stderr, "osprey bench serve: cannot write %s\n", o.output_csv.c_str());
    rc = 1;
  }
  if (!o.plot_dir.empty()) write_charts(o.plot_dir, runs, sweep_concurrency);
  return rc;
}

}  // namespace osprey::bench
