// RequestOutput::queue_time_s: submit() to the step that first scheduled the
// request, reported once, over the fake executor.
#include <gtest/gtest.h>

#include <chrono>

#include "engine/engine_impl.h"
#include "fake_model.h"

namespace osprey::testing {
namespace {

std::unique_ptr<Engine> make_engine_for_queue(int max_num_seqs, int step_delay_us) {
  EngineConfig config;
  config.num_kv_blocks = 64;
  config.block_size = 4;
  config.max_num_seqs = max_num_seqs;
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

Request greedy(const std::string& prompt, int max_tokens) {
  Request r;
  r.prompt = prompt;
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

struct QueueSeen {
  int num_outputs = 0;
  int num_with_queue_time = 0;
  int first_with_queue_time = -1;  // output number carrying it
  double queue_time_s = -1.0;
};

QueueSeen drain_queue_times(RequestStream& s) {
  QueueSeen q;
  while (auto out = s.next()) {
    if (out->queue_time_s) {
      ++q.num_with_queue_time;
      if (q.first_with_queue_time < 0) q.first_with_queue_time = q.num_outputs;
      q.queue_time_s = *out->queue_time_s;
    }
    ++q.num_outputs;
  }
  return q;
}

TEST(EngineQueueTime, ReportedOnceOnTheFirstOutput) {
  auto engine = make_engine_for_queue(8, 0);
  const auto before = std::chrono::steady_clock::now();
  auto s = engine->submit(greedy("hello", 10));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  QueueSeen q = drain_queue_times(**s);
  const double bound = std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  EXPECT_GT(q.num_outputs, 1);
  EXPECT_EQ(q.num_with_queue_time, 1);
  EXPECT_EQ(q.first_with_queue_time, 0);
  EXPECT_GE(q.queue_time_s, 0.0);
  EXPECT_LE(q.queue_time_s, bound);  // scheduled after submit, before the last output was read
}

TEST(EngineQueueTime, WaitingBehindAFullBatchCounts) {
  // One running sequence at most: B is scheduled only after A's 40 steps,
  // each of which sleeps >= 2 ms, so B queued for >= 39 steps (A may have
  // started its first step before B arrived); A started at once.
  constexpr int kSteps = 40;
  constexpr int kDelayUs = 2000;
  auto engine = make_engine_for_queue(1, kDelayUs);
  auto a = engine->submit(greedy("first", kSteps));
  auto b = engine->submit(greedy("second", 4));
  ASSERT_TRUE(a.ok() && b.ok());
  QueueSeen qa = drain_queue_times(**a);
  QueueSeen qb = drain_queue_times(**b);
  EXPECT_EQ(qa.num_with_queue_time, 1);
  EXPECT_EQ(qb.num_with_queue_time, 1);
  EXPECT_EQ(qb.first_with_queue_time, 0);
  EXPECT_GE(qb.queue_time_s, (kSteps - 1) * kDelayUs * 1e-6);
  EXPECT_LT(qa.queue_time_s, qb.queue_time_s);
}

TEST(EngineQueueTime, AbortedBeforeSchedulingHasNone) {
  // A occupies the only slot; B is cancelled while waiting and never scheduled.
  auto engine = make_engine_for_queue(1, 1000);
  auto a = engine->submit(greedy("first", 240));
  auto b = engine->submit(greedy("second", 4));
  ASSERT_TRUE(a.ok() && b.ok());
  (*b)->cancel();
  QueueSeen qb = drain_queue_times(**b);
  (*a)->cancel();
  drain_queue_times(**a);
  EXPECT_GE(qb.num_outputs, 1);
  EXPECT_EQ(qb.num_with_queue_time, 0);
}

}  // namespace
}  // namespace osprey::testing
