// Asynchronous scheduling (EngineCore launches step N + 1 before waiting for
// step N) over AsyncFakeExecutor, whose split steps really defer: outputs
// must be identical with overlap on and off and equal the unbatched
// reference, through EOS while the next step is in flight, cancellations at
// every point, stop strings (finish_sequence), n > 1, penalties, host rows,
// preemption by recompute and by swap, and executor failures; no page or
// swap slot may leak.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "async_fake.h"
#include "core_harness.h"
#include "engine/engine_core.h"
#include "engine/engine_impl.h"
#include "engine/output_processor.h"

namespace osprey::testing {
namespace {

// A token that ends a request "by stop string" (the output side calls
// finish_sequence after seeing it) for requests with stop_on_token.
constexpr int32_t kStopStringToken = 5;

struct Spec {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
  int priority = 0;
  uint64_t seed = 0;
  int arrive_at = 0;      // step() call before which it is added
  int abort_at = -1;      // step() call before which it is aborted (-1: never)
  bool stop_on_token = false;
};

struct SeqOut {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::kNone;
  int num_finish_events = 0;
  bool stopped_by_string = false;
};

struct RunResult {
  std::map<std::string, std::vector<SeqOut>> out;
  int64_t overlapped = 0;
  int64_t preemptions = 0;
  int64_t swap_outs = 0;
  int64_t dropped_rows = 0;
  int calls = 0;
};

RunResult drive(const CoreConfig& cfg, AsyncFakeExecutor& exec, std::vector<Spec> specs) {
  RunResult run;
  EngineCore core(cfg, exec);
  EXPECT_TRUE(core.initialize().ok());
  auto link = std::make_shared<EngineLink>();
  std::map<std::string, uint64_t> keys;
  std::map<std::string, const Spec*> by_id;
  std::stable_sort(specs.begin(), specs.end(), [](const Spec& a, const Spec& b) { return a.arrive_at < b.arrive_at; });
  std::vector<const Spec*> aborts;
  for (const Spec& s : specs) {
    by_id[s.id] = &s;
    run.out[s.id].resize(static_cast<size_t>(s.params.n));
    if (s.abort_at >= 0) aborts.push_back(&s);
  }
  std::stable_sort(aborts.begin(), aborts.end(), [](const Spec* a, const Spec* b) { return a->abort_at < b->abort_at; });
  size_t next_spec = 0, next_abort = 0;
  uint64_t next_key = 1;
  std::vector<SeqEvent> events;
  auto collect = [&] {
    for (SeqEvent& e : events) {
      SeqOut& o = run.out.at(e.sink->id).at(static_cast<size_t>(e.index));
      if (e.token >= 0) {
        EXPECT_EQ(o.finish, FinishReason::kNone) << e.sink->id << ": token after finish";
        EXPECT_FALSE(o.stopped_by_string) << e.sink->id << ": token after its stop string";
        o.tokens.push_back(e.token);
      }
      if (e.logprobs) o.logprobs.push_back(e.logprobs->logprob);
      if (e.finish != FinishReason::kNone) {
        o.finish = e.finish;
        ++o.num_finish_events;
      }
      const Spec& s = *by_id.at(e.sink->id);
      if (s.stop_on_token && e.token == kStopStringToken && e.finish == FinishReason::kNone) {
        o.stopped_by_string = true;
        core.finish_sequence(keys.at(s.id), e.index);  // as the output side does
      }
    }
    events.clear();
  };
  const int kMaxCalls = 400000;
  for (int call = 0; call < kMaxCalls; ++call) {
    while (next_spec < specs.size() && specs[next_spec].arrive_at <= call) {
      const Spec& s = specs[next_spec++];
      auto req = std::make_unique<RequestState>();
      req->key = next_key++;
      keys[s.id] = req->key;
      req->id = s.id;
      req->params = s.params;
      req->priority = s.priority;
      req->seed = s.seed;
      req->sink = std::make_shared<RequestSink>(s.id, s.params, static_cast<int>(s.prompt.size()),
                                                std::span<const int32_t>(), nullptr, link);
      core.add_request(std::move(req), s.prompt);
    }
    while (next_abort < aborts.size() && aborts[next_abort]->abort_at <= call) {
      core.abort_request(keys.count(aborts[next_abort]->id) ? keys.at(aborts[next_abort]->id) : 0, events);
      ++next_abort;
      collect();
    }
    if (next_spec == specs.size() && !core.has_work()) break;
    if (core.has_work()) {
      const Status st = core.step(events);
      EXPECT_TRUE(st.ok()) << st.to_string();
      collect();
      EXPECT_LE(core.num_inflight(), 1);
      EXPECT_LE(core.last_schedule().num_tokens, cfg.scheduler.max_num_batched_tokens);
    }
    ++run.calls;
  }
  EXPECT_FALSE(core.has_work()) << "did not finish";
  EXPECT_FALSE(exec.inner().read_unwritten) << "a step read KV never written";
  // No leaks: every page back in the pool (cached pages count as free), every swap slot free.
  EXPECT_EQ(core.kv().num_free_blocks(), core.kv().num_blocks());
  EXPECT_EQ(core.kv().num_free_swap_blocks(), core.kv().num_swap_blocks());
  EXPECT_EQ(core.scheduler().num_running(), 0);
  EXPECT_EQ(core.scheduler().num_waiting(), 0);
  EXPECT_EQ(core.num_requests(), 0u);
  run.overlapped = core.num_overlapped_steps();
  run.preemptions = core.scheduler().num_preemptions();
  run.swap_outs = core.scheduler().num_swap_outs();
  run.dropped_rows = core.stats().num_dropped_rows;
  return run;
}

// What a sequence that was not aborted must have produced.
void expect_reference(const Spec& s, int index, const SeqOut& o, int max_model_len, const std::string& what) {
  RefResult ref = reference_generate(s.prompt, s.params, s.seed, index, max_model_len);
  std::vector<int32_t> want = ref.tokens;
  FinishReason finish = ref.finish;
  if (s.stop_on_token) {
    auto it = std::find(want.begin(), want.end(), kStopStringToken);
    if (it != want.end() && it + 1 != want.end()) {
      want.erase(it + 1, want.end());
      finish = FinishReason::kNone;  // finish_sequence: no finish event
    }
  }
  EXPECT_EQ(o.tokens, want) << what << " " << s.id << "/" << index;
  EXPECT_EQ(o.finish, finish) << what << " " << s.id << "/" << index;
  EXPECT_EQ(o.num_finish_events, finish == FinishReason::kNone ? 0 : 1) << what << " " << s.id << "/" << index;
}

bool aborted(const std::vector<SeqOut>& seqs) {
  for (const SeqOut& o : seqs)
    if (o.finish == FinishReason::kAbort) return true;
  return false;
}

// Runs the specs with overlap off and on; non-aborted sequences must be
// identical in both and equal the reference. Returns the async run.
RunResult compare_on_off(const CoreConfig& base, const std::vector<Spec>& specs, const std::string& what,
                   AsyncFakeExecutor* async_exec_out = nullptr) {
  CoreConfig off_cfg = base;
  off_cfg.async_scheduling = false;
  AsyncFakeExecutor off_exec(true);
  RunResult off = drive(off_cfg, off_exec, specs);
  EXPECT_EQ(off.overlapped, 0) << what;
  EXPECT_EQ(off_exec.num_fills, 0) << what;

  CoreConfig on_cfg = base;
  on_cfg.async_scheduling = true;
  AsyncFakeExecutor local(true);
  AsyncFakeExecutor& on_exec = async_exec_out ? *async_exec_out : local;
  RunResult on = drive(on_cfg, on_exec, specs);
  EXPECT_LE(on_exec.max_in_flight, 2) << what;

  std::map<std::string, const Spec*> by_id;
  for (const Spec& s : specs) by_id[s.id] = &s;
  int compared = 0;
  for (const auto& [id, seqs_off] : off.out) {
    const auto& seqs_on = on.out.at(id);
    if (aborted(seqs_off) || aborted(seqs_on)) continue;
    for (size_t i = 0; i < seqs_off.size(); ++i) {
      EXPECT_EQ(seqs_on[i].tokens, seqs_off[i].tokens) << what << " " << id << "/" << i;
      EXPECT_EQ(seqs_on[i].logprobs, seqs_off[i].logprobs) << what << " " << id << "/" << i;
      EXPECT_EQ(seqs_on[i].finish, seqs_off[i].finish) << what << " " << id << "/" << i;
      expect_reference(*by_id.at(id), static_cast<int>(i), seqs_on[i], base.max_model_len, what + " (async)");
      expect_reference(*by_id.at(id), static_cast<int>(i), seqs_off[i], base.max_model_len, what + " (sync)");
      ++compared;
    }
  }
  EXPECT_GT(compared, 0) << what;
  return on;
}

TEST(AsyncScheduling, OverlapsDecodeStepsAndMatchesSync) {
  CoreConfig c = small_core_config();
  std::mt19937 rng(3);
  std::vector<Spec> specs;
  for (int i = 0; i < 12; ++i) {
    Spec s;
    s.id = "r" + std::to_string(i);
    s.prompt = random_prompt(rng, 3 + i * 5 % 19);
    s.params = greedy(8 + i % 9);
    s.params.ignore_eos = true;
    if (i % 3 == 1) s.params.temperature = 0.8f, s.params.top_k = 10, s.params.seed = 7;
    if (i % 4 == 2) s.params.logprobs = 2;
    s.seed = 40 + i;
    specs.push_back(s);
  }
  AsyncFakeExecutor exec(true);
  RunResult run2 = compare_on_off(c, specs, "batch", &exec);
  EXPECT_GT(run2.overlapped, 10);
  EXPECT_GT(exec.num_fills, 50);
  EXPECT_EQ(exec.max_in_flight, 2);
  EXPECT_EQ(exec.num_overlapped_launches, run2.overlapped);
  // Every request ends by max_tokens, known at launch: no row is wasted.
  EXPECT_EQ(run2.dropped_rows, 0);
}

TEST(AsyncScheduling, EosWhileTheNextStepIsInFlightDropsItsRow) {
  // Greedy requests that stop on EOS mid-way: each one's next step was
  // already launched when its EOS is seen; the row is dropped and its pages
  // freed (the pool must end full, outputs must equal the reference).
  CoreConfig c = small_core_config();
  std::mt19937 rng(11);
  std::vector<Spec> specs;
  int stopping = 0;
  for (int i = 0; specs.size() < 24 && i < 20000; ++i) {
    Spec s;
    s.id = "e" + std::to_string(i);
    s.prompt = random_prompt(rng, 2 + i % 13);
    s.params = greedy(40);
    const RefResult ref = reference_generate(s.prompt, s.params, 0, 0, c.max_model_len);
    const bool eos = ref.finish == FinishReason::kStop && ref.tokens.size() >= 3;
    if (!eos && specs.size() % 3 != 0) continue;
    stopping += eos;
    specs.push_back(s);
  }
  ASSERT_GT(stopping, 10);
  AsyncFakeExecutor exec(true);
  RunResult on = compare_on_off(c, specs, "eos", &exec);
  EXPECT_GT(on.overlapped, 0);
  EXPECT_GT(on.dropped_rows, 5);  // rows launched before their sequence's EOS was seen
}

TEST(AsyncScheduling, PenaltiesAndHostRowsWaitForThePreviousStep) {
  // Penalties list output tokens in the device rows and host-sampled rows
  // (more top logprobs than the device returns) need the logits on the
  // host: no step may then start before its predecessor is processed, so
  // no token is ever filled on the device.
  CoreConfig c = small_core_config();
  std::mt19937 rng(5);
  std::vector<Spec> specs;
  for (int i = 0; i < 16; ++i) {
    Spec s;
    s.id = "p" + std::to_string(i);
    s.prompt = random_prompt(rng, 3 + i % 11);
    s.params = greedy(6 + i % 7);
    switch (i % 4) {
      case 0: s.params.repetition_penalty = 1.3f; break;
      case 1: s.params.frequency_penalty = 0.4f, s.params.temperature = 0.7f; break;
      case 2: s.params.presence_penalty = 0.8f; break;
      default: s.params.logprobs = kMaxDeviceTopLogprobs + 5; break;
    }
    s.seed = i;
    specs.push_back(s);
  }
  AsyncFakeExecutor exec(true);
  compare_on_off(c, specs, "penalties", &exec);
  EXPECT_EQ(exec.num_fills, 0);
  EXPECT_GT(exec.num_host_logit_steps, 0);
}

TEST(AsyncScheduling, ForksPromptLogprobsAndStopIdsMatchSync) {
  CoreConfig c = small_core_config();
  std::mt19937 rng(8);
  std::vector<Spec> specs;
  for (int i = 0; i < 20; ++i) {
    Spec s;
    s.id = "f" + std::to_string(i);
    s.prompt = random_prompt(rng, 3 + i * 7 % 23);
    s.params = greedy(5 + i % 9);
    s.seed = 900 + i;
    switch (i % 5) {
      case 0: s.params.n = 3, s.params.temperature = 0.9f; break;
      case 1: s.params.prompt_logprobs = 2; break;
      case 2: s.params.stop_token_ids = {7, 9, 11}, s.params.min_tokens = 2; break;
      case 3: s.params.logit_bias = {{kFakeEos, 3.0f}}, s.params.min_tokens = 3; break;
      default: s.stop_on_token = true, s.params.max_tokens = 30, s.params.temperature = 1.0f; break;
    }
    specs.push_back(s);
  }
  AsyncFakeExecutor exec(true);
  RunResult on = compare_on_off(c, specs, "forks", &exec);
  EXPECT_GT(on.overlapped, 0);
  EXPECT_GT(exec.num_fills, 0);
}

std::vector<Spec> random_specs(std::mt19937& rng, int count, int max_model_len, bool with_aborts) {
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 4; ++i) prefixes.push_back(random_prompt(rng, 4 + 4 * i));
  std::vector<Spec> specs;
  int arrive = 0;
  for (int i = 0; i < count; ++i) {
    Spec s;
    s.id = "s" + std::to_string(i);
    if (rng() % 2) s.prompt = prefixes[rng() % prefixes.size()];
    auto tail = random_prompt(rng, 1 + static_cast<int>(rng() % 20));
    s.prompt.insert(s.prompt.end(), tail.begin(), tail.end());
    if (static_cast<int>(s.prompt.size()) + 1 >= max_model_len) s.prompt.resize(static_cast<size_t>(max_model_len / 2));
    SamplingParams& p = s.params;
    p.temperature = (rng() % 2) ? 0.0f : 0.8f;
    if (rng() % 3 == 0) p.top_p = 0.8f;
    p.max_tokens = 1 + static_cast<int>(rng() % 24);
    p.ignore_eos = rng() % 4 == 0;
    const int kind = static_cast<int>(rng() % 16);
    if (kind == 0) p.n = 2 + static_cast<int>(rng() % 3);
    if (kind == 1) p.repetition_penalty = 1.2f;
    if (kind == 2) p.frequency_penalty = 0.3f, p.presence_penalty = 0.2f;
    if (kind == 3) p.prompt_logprobs = 1;
    if (kind == 4) p.logprobs = 3;
    if (kind == 5) p.logprobs = kMaxDeviceTopLogprobs + 1;  // sampled on the host
    if (kind == 6) p.stop_token_ids = {static_cast<int32_t>(1 + rng() % 63)};
    if (kind == 7) p.min_tokens = static_cast<int>(rng() % 4);
    if (kind >= 12 && p.n == 1) s.stop_on_token = true;
    s.priority = static_cast<int>(rng() % 3);
    s.seed = rng();
    arrive += static_cast<int>(rng() % 3 == 0);
    s.arrive_at = arrive;
    if (with_aborts && rng() % 10 == 0) s.abort_at = arrive + static_cast<int>(rng() % 40);
    specs.push_back(s);
  }
  return specs;
}

TEST(AsyncScheduling, RandomizedIdenticalOnOffNoLeaks) {
  // Thousands of requests with random lengths, parameters, arrivals and
  // cancellations over small pools: with prefix caching and recompute
  // preemption, with swap, and with chunked prefill off.
  struct Variant {
    const char* name;
    int num_blocks, num_swap_blocks;
    bool chunked, prefix;
  };
  const Variant variants[] = {{"recompute", 40, 0, true, true},
                              {"swap", 40, 24, true, true},
                              {"unchunked no-prefix", 48, 0, false, false}};
  std::mt19937 rng(2024);
  int v_index = 0;
  for (const Variant& v : variants) {
    CoreConfig c = small_core_config();
    c.num_blocks = v.num_blocks;
    c.num_swap_blocks = v.num_swap_blocks;
    c.enable_prefix_caching = v.prefix;
    c.scheduler.enable_chunked_prefill = v.chunked;
    c.scheduler.max_num_seqs = 12;
    c.scheduler.max_num_batched_tokens = v.chunked ? 24 : 64;
    c.max_model_len = 64;
    const std::vector<Spec> specs = random_specs(rng, v_index == 0 ? 1500 : 700, c.max_model_len, true);
    AsyncFakeExecutor exec(true);
    RunResult on = compare_on_off(c, specs, v.name, &exec);
    EXPECT_GT(on.overlapped, 100) << v.name;
    EXPECT_GT(exec.num_fills, 100) << v.name;
    EXPECT_GT(on.preemptions, 0) << v.name;
    if (v.num_swap_blocks > 0) {
      EXPECT_GT(on.swap_outs, 0) << v.name;
    }
    ++v_index;
  }
}

TEST(AsyncScheduling, CancelAtEveryCallOfOneRequest) {
  // The same workload, cancelling one request before each successive call:
  // wherever the cancel lands (waiting, mid-prefill, with a step in flight),
  // nothing leaks and the others are unaffected.
  CoreConfig c = small_core_config();
  std::mt19937 rng(77);
  std::vector<Spec> base = random_specs(rng, 10, c.max_model_len, false);
  for (Spec& s : base) s.arrive_at = 0;
  base[3].params.n = 2;
  base[3].params.max_tokens = 12;
  base[3].params.ignore_eos = true;
  for (int at = 0; at < 30; ++at) {
    std::vector<Spec> specs = base;
    specs[3].abort_at = at;
    compare_on_off(c, specs, "abort at " + std::to_string(at));
  }
}

TEST(AsyncScheduling, ExecutorFailureWithAStepInFlightFinishesEverything) {
  CoreConfig c = small_core_config();
  std::mt19937 rng(4);
  AsyncFakeExecutor exec(true);
  exec.fail_at_run = 6;
  EngineCore core(c, exec);
  ASSERT_TRUE(core.initialize().ok());
  ASSERT_TRUE(core.async_scheduling());
  auto link = std::make_shared<EngineLink>();
  for (int i = 0; i < 6; ++i) {
    auto req = std::make_unique<RequestState>();
    req->key = static_cast<uint64_t>(i + 1);
    req->id = "x" + std::to_string(i);
    req->params = greedy(30);
    req->params.ignore_eos = true;
    req->sink = std::make_shared<RequestSink>(req->id, req->params, 4, std::span<const int32_t>(), nullptr, link);
    core.add_request(std::move(req), random_prompt(rng, 4));
  }
  std::vector<SeqEvent> events;
  bool failed = false;
  std::map<std::string, FinishReason> finish;
  for (int i = 0; i < 100 && core.has_work(); ++i) {
    const Status st = core.step(events);
    if (!st.ok()) failed = true;
    for (const SeqEvent& e : events)
      if (e.finish != FinishReason::kNone) finish[e.sink->id] = e.finish;
    events.clear();
  }
  EXPECT_TRUE(failed);
  EXPECT_FALSE(core.has_work());
  EXPECT_EQ(core.num_inflight(), 0);
  EXPECT_EQ(finish.size(), 6u);
  for (const auto& [id, f] : finish) EXPECT_EQ(f, FinishReason::kError) << id;
  EXPECT_EQ(core.kv().num_free_blocks(), core.kv().num_blocks());
}

// The whole engine (loop thread, output workers, stop strings matched on
// text) over the deferring executor: every output equals the synchronous one.
std::unique_ptr<Engine> make_async_fake_engine(bool async) {
  EngineConfig config;
  config.num_kv_blocks = 48;
  config.block_size = 4;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 32;
  config.async_scheduling = async;
  EngineParts parts;
  parts.executor = std::make_unique<AsyncFakeExecutor>(true);
  parts.codec = std::make_unique<FakeCodec>();
  parts.eos_token_ids = {kFakeEos};
  parts.model_max_len = 128;
  parts.model_path = "fake";
  auto e = make_engine(config, std::move(parts));
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

TEST(AsyncScheduling, EngineOutputsAndStopStringsMatchSync) {
  std::map<bool, std::vector<std::string>> texts;
  std::map<bool, EngineStats> stats;
  for (bool async : {false, true}) {
    auto engine = make_async_fake_engine(async);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 24; ++i) {
      Request r;
      r.prompt = std::string("abcdefgh").substr(0, static_cast<size_t>(1 + i % 8)) + std::to_string(i);
      r.params.temperature = i % 2 ? 0.8f : 0.0f;
      r.params.seed = 100 + i;
      r.params.max_tokens = 10 + i % 13;
      r.params.ignore_eos = i % 3 == 0;
      if (i % 4 == 1) r.params.stop = {"a", "Q", "7"};
      r.request_id = "q" + std::to_string(i);
      auto s = engine->submit(r);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      streams.push_back(*s);
    }
    for (auto& s : streams) {
      std::string text;
      std::string finish;
      while (auto o = s->next()) {
        for (auto& c : o->outputs) {
          text += c.text;
          if (c.finish_reason != FinishReason::kNone) finish = std::to_string(static_cast<int>(c.finish_reason));
        }
      }
      texts[async].push_back(text + "|" + finish);
    }
    stats[async] = engine->stats();
  }
  EXPECT_EQ(texts[true], texts[false]);
  EXPECT_EQ(stats[false].num_overlapped_steps, 0);
  EXPECT_GT(stats[true].num_overlapped_steps, 0);
}

}  // namespace
}  // namespace osprey::testing
