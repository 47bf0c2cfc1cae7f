// The public Engine API (threads, streams, stop strings, cancellation,
// errors) over the fake executor and the one-character-per-token codec.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "engine/engine_impl.h"
#include "fake_model.h"

namespace osprey::testing {
namespace {

std::unique_ptr<Engine> make_fake_engine(EngineConfig config = {}, int step_delay_us = 0) {
  if (config.num_kv_blocks == 0) config.num_kv_blocks = 64;
  config.block_size = 4;
  EngineParts parts;
  auto exec = std::make_unique<FakeExecutor>();
  exec->step_delay_us = step_delay_us;
  parts.executor = std::move(exec);
  parts.codec = std::make_unique<FakeCodec>();
  parts.eos_token_ids = {kFakeEos};
  parts.model_max_len = 256;
  parts.model_path = "fake";
  auto e = make_engine(config, std::move(parts));
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::string stop_string;
  Usage usage;
  int num_outputs = 0;
};

Collected drain(RequestStream& s, int index = 0) {
  Collected c;
  while (auto out = s.next()) {
    ++c.num_outputs;
    for (auto& o : out->outputs) {
      if (o.index != index) continue;
      c.tokens.insert(c.tokens.end(), o.token_ids.begin(), o.token_ids.end());
      c.text += o.text;
      if (o.finish_reason != FinishReason::kNone) {
        c.finish = o.finish_reason;
        c.stop_string = o.stop_string;
      }
    }
    c.usage = out->usage;
    if (out->finished) {
      EXPECT_FALSE(s.next().has_value());
    }
  }
  EXPECT_TRUE(s.done());
  return c;
}

std::string ref_text(const std::vector<int32_t>& tokens) {
  std::string t;
  for (int32_t id : tokens)
    if (id != kFakeEos) t += FakeCodec::token_text(id);
  return t;
}

TEST(EngineApi, StreamsGreedyTextAndUsage) {
  auto engine = make_fake_engine();
  Request r;
  r.prompt = "hello world";
  r.params.temperature = 0;
  r.params.max_tokens = 12;
  r.params.ignore_eos = true;
  auto s = engine->submit(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  Collected c = drain(**s);
  auto prompt = FakeCodec().encode("hello world", true);
  RefResult ref = reference_generate(prompt, r.params, 0, 0, 256);
  EXPECT_EQ(c.tokens, ref.tokens);
  EXPECT_EQ(c.text, ref_text(ref.tokens));
  EXPECT_EQ(c.finish, FinishReason::kLength);
  EXPECT_EQ(c.usage.prompt_tokens, static_cast<int>(prompt.size()));
  EXPECT_EQ(c.usage.completion_tokens, 12);
}

TEST(EngineApi, ConcurrentSubmittersGetTheirOwnOutputs) {
  auto engine = make_fake_engine();
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 10; ++i) {
        Request r;
        r.prompt_token_ids.resize(1 + rng() % 20);
        for (auto& x : r.prompt_token_ids) x = 1 + rng() % 63;
        r.params.temperature = 0.7f;
        r.params.seed = rng();
        r.params.max_tokens = 1 + rng() % 10;
        auto s = engine->submit(r);
        if (!s.ok()) {
          ++mismatches;
          continue;
        }
        Collected c = drain(**s);
        RefResult ref = reference_generate(r.prompt_token_ids, r.params, *r.params.seed, 0, 256);
        if (c.tokens != ref.tokens || c.finish != ref.finish) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  auto st = engine->stats();
  EXPECT_EQ(st.num_finished_requests, 40);
  EXPECT_EQ(st.num_free_kv_blocks, st.num_kv_blocks);
}

// Stop strings taken from the reference text: the output ends right before
// the stop (which spans several one-character tokens), and no partial stop
// text ever reaches the stream.
TEST(EngineApi, StopStringsAcrossTokensNeverLeak) {
  auto engine = make_fake_engine();
  std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 30;
  p.ignore_eos = true;
  RefResult ref = reference_generate(prompt, p, 0, 0, 256);
  const std::string full = ref_text(ref.tokens);
  ASSERT_GE(full.size(), 20u);
  for (int include = 0; include < 2; ++include) {
    for (size_t start : {size_t{0}, size_t{5}, size_t{12}}) {
      const std::string stop = full.substr(start, 3);
      Request r;
      r.prompt_token_ids = prompt;
      r.params = p;
      r.params.stop = {stop, "\x01never"};
      r.params.include_stop_str_in_output = include;
      auto s = engine->submit(r);
      ASSERT_TRUE(s.ok());
      std::string streamed;
      Collected c;
      while (auto out = (*s)->next()) {
        for (auto& o : out->outputs) {
          streamed += o.text;
          // No prefix of the stop string may end the streamed text early.
          if (o.finish_reason == FinishReason::kNone && !streamed.empty()) {
            const size_t pos = full.find(stop);
            EXPECT_LE(streamed.size(), pos) << "leaked text beyond the stop position";
          }
          if (o.finish_reason != FinishReason::kNone) {
            c.finish = o.finish_reason;
            c.stop_string = o.stop_string;
          }
        }
      }
      const size_t pos = full.find(stop);
      EXPECT_EQ(streamed, full.substr(0, pos + (include ? stop.size() : 0)));
      EXPECT_EQ(c.finish, FinishReason::kStop);
      EXPECT_EQ(c.stop_string, stop);
    }
  }
  // A stop string is found by the output worker, which delivers the final
  // output and then asks the engine loop to finish the sequence: the
  // scheduler lets it go a moment later (bounded wait, not a timing check).
  bool released = false;
  for (int i = 0; i < 3000 && !released; ++i) {
    const auto st = engine->stats();
    released = st.num_running + st.num_waiting == 0;
    if (!released) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(released) << "a stopped request still holds its sequence after 3 s";
}

TEST(EngineApi, StopTokenIdIsReturnedButNotDetokenized) {
  auto engine = make_fake_engine();
  std::vector<int32_t> prompt = {7, 7, 7};
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 30;
  p.ignore_eos = true;
  RefResult ref = reference_generate(prompt, p, 0, 0, 256);
  Request r;
  r.prompt_token_ids = prompt;
  r.params = p;
  r.params.stop_token_ids = {ref.tokens[4]};
  auto s = engine->submit(r);
  ASSERT_TRUE(s.ok());
  Collected c = drain(**s);
  const size_t k = std::find(ref.tokens.begin(), ref.tokens.end(), ref.tokens[4]) - ref.tokens.begin();
  EXPECT_EQ(c.tokens, std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + k + 1));
  EXPECT_EQ(c.text, ref_text(std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + k)));
  EXPECT_EQ(c.finish, FinishReason::kStop);
}

TEST(EngineApi, ParallelSamplingNDeliversEveryIndex) {
  auto engine = make_fake_engine();
  Request r;
  r.prompt_token_ids = {1, 2, 3, 4, 5, 6};
  r.params.n = 3;
  r.params.seed = 123;
  r.params.max_tokens = 8;
  r.params.ignore_eos = true;
  auto s = engine->submit(r);
  ASSERT_TRUE(s.ok());
  std::vector<Collected> per(3);
  while (auto out = (*s)->next())
    for (auto& o : out->outputs) {
      per[o.index].tokens.insert(per[o.index].tokens.end(), o.token_ids.begin(), o.token_ids.end());
      if (o.finish_reason != FinishReason::kNone) per[o.index].finish = o.finish_reason;
    }
  for (int i = 0; i < 3; ++i) {
    RefResult ref = reference_generate(r.prompt_token_ids, r.params, 123, i, 256);
    EXPECT_EQ(per[i].tokens, ref.tokens) << i;
    EXPECT_EQ(per[i].finish, FinishReason::kLength);
  }
}

TEST(EngineApi, SubmitRejectsWhatCanNeverRun) {
  EngineConfig cfg;
  cfg.num_kv_blocks = 8;  // 32 tokens
  auto engine = make_fake_engine(cfg);
  Request r;
  r.prompt_token_ids.assign(40, 3);
  auto s = engine->submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted);
  r.prompt_token_ids.assign(300, 3);  // beyond the 256-token context
  s = engine->submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kOutOfRange);
  r.prompt_token_ids = {1, 2, 99};
  EXPECT_EQ(engine->submit(r).status().code(), StatusCode::kInvalidArgument);
  r.prompt_token_ids = {1, 2};
  r.params.temperature = -1;
  EXPECT_EQ(engine->submit(r).status().code(), StatusCode::kInvalidArgument);
  r = Request{};
  EXPECT_EQ(engine->submit(r).status().code(), StatusCode::kInvalidArgument);  // empty prompt
}

TEST(EngineApi, CancelStopsAStreamWithAbort) {
  auto engine = make_fake_engine({}, 2000);  // 2 ms a step: 200 tokens take 400 ms
  Request r;
  r.request_id = "long-one";
  r.prompt_token_ids = {1, 2, 3};
  r.params.max_tokens = 200;
  r.params.ignore_eos = true;
  auto s = engine->submit(r);
  ASSERT_TRUE(s.ok());
  auto first = (*s)->next();
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(engine->cancel("long-one"));
  FinishReason last = FinishReason::kNone;
  while (auto out = (*s)->next())
    for (auto& o : out->outputs)
      if (o.finish_reason != FinishReason::kNone) last = o.finish_reason;
  EXPECT_EQ(last, FinishReason::kAbort);
  EXPECT_FALSE(engine->cancel("long-one"));
  EXPECT_FALSE(engine->cancel("unknown"));
}

TEST(EngineApi, CallbackReceivesOutputsInOrder) {
  auto engine = make_fake_engine();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  bool finished = false;
  Request r;
  r.prompt_token_ids = {9, 8, 7};
  r.params.temperature = 0;
  r.params.max_tokens = 10;
  r.params.ignore_eos = true;
  auto s = engine->submit(r, [&](const RequestOutput& out) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& o : out.outputs) tokens.insert(tokens.end(), o.token_ids.begin(), o.token_ids.end());
    if (out.finished) finished = true;
    cv.notify_all();
  });
  ASSERT_TRUE(s.ok());
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return finished; }));
  EXPECT_EQ(tokens, reference_generate(r.prompt_token_ids, r.params, 0, 0, 256).tokens);
}

TEST(EngineApi, ShutdownAbortsEverythingInFlight) {
  auto engine = make_fake_engine();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 10; ++i) {
    Request r;
    r.prompt_token_ids = {1, 2, 3, static_cast<int32_t>(i + 1)};
    r.params.max_tokens = 200;
    r.params.ignore_eos = true;
    streams.push_back(*engine->submit(r));
  }
  engine->shutdown();
  for (auto& s : streams) {
    Collected c = drain(*s);
    EXPECT_NE(c.finish, FinishReason::kNone);
  }
  Request r;
  r.prompt_token_ids = {1};
  EXPECT_EQ(engine->submit(r).status().code(), StatusCode::kUnavailable);
}

TEST(EngineApi, EncodeDecodeThroughTheEngine) {
  auto engine = make_fake_engine();
  auto ids = engine->encode("abc");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(engine->decode({1, 2, 3, 0}), "abc");
}

}  // namespace
}  // namespace osprey::testing
