// Workload generators produce the lengths asked, with real tokenizers.
#include "bench/workload.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "bench/arrival.h"
#include "osprey/text.h"

namespace osprey::bench {
namespace {

namespace fs = std::filesystem;

// Tokenizers found on this machine: the shared test tokenizers and the default
// model when it is cached. Tests skip when there are none.
std::vector<std::string> tokenizer_paths() {
  std::vector<std::string> out;
  const std::string shared = std::string(OSPREY_SOURCE_DIR) + "/../shared/tokenizers/";
  for (const char* name : {"llama3", "mistral", "qwen3"})
    if (fs::exists(shared + name + "/tokenizer.json")) out.push_back(shared + name);
  const char* home = std::getenv("HOME");
  const std::string model = std::string(home ? home : "") + "/.cache/osprey/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (fs::exists(model)) out.push_back(model);
  return out;
}

// Loaded once per path for the whole binary (large vocabularies take a while).
std::shared_ptr<const TextProcessor> open_text(const std::string& path) {
  static std::map<std::string, std::shared_ptr<const TextProcessor>> cache;
  if (auto it = cache.find(path); it != cache.end()) return it->second;
  auto t = TextProcessor::open(path);
  EXPECT_TRUE(t.ok()) << path << ": " << t.status().to_string();
  if (!t.ok()) return nullptr;
  return cache[path] = std::shared_ptr<const TextProcessor>(std::move(t).value());
}

TEST(Workload, ExactPromptLengthsWithRealTokenizers) {
  const auto paths = tokenizer_paths();
  if (paths.empty()) GTEST_SKIP() << "no tokenizer on this machine";
  for (const auto& path : paths) {
    auto text = open_text(path);
    ASSERT_NE(text, nullptr);
    for (bool special : {true, false}) {
      auto b = PromptBuilder::create(text, special);
      ASSERT_TRUE(b.ok()) << path << ": " << b.status().to_string();
      WorkloadOptions o;
      o.num_prompts = 12;
      o.seed = 7;
      o.dist = "uniform";
      o.range_ratio = 0.5;
      o.input_len = 64;
      o.output_len = 20;
      auto convs = make_workload(o, **b);
      ASSERT_TRUE(convs.ok()) << convs.status().to_string();
      ASSERT_EQ(convs->size(), 12u);
      for (const auto& c : *convs) {
        ASSERT_EQ(c.turns.size(), 1u);
        const Turn& t = c.turns[0];
        EXPECT_GE(t.input_tokens, 32);
        EXPECT_LE(t.input_tokens, 96);
        EXPECT_GE(t.output_tokens, 10);
        EXPECT_LE(t.output_tokens, 30);
        // What the server will count: the whole prompt encoded.
        EXPECT_EQ(static_cast<int>(text->encode(t.text, special).size()), t.input_tokens) << path;
      }
      // Fixed lengths: every prompt exactly input_len.
      o.range_ratio = 0;
      o.input_len = 200;
      convs = make_workload(o, **b);
      ASSERT_TRUE(convs.ok());
      for (const auto& c : *convs) {
        EXPECT_EQ(c.turns[0].input_tokens, 200) << path;
        EXPECT_EQ(static_cast<int>(text->encode(c.turns[0].text, special).size()), 200) << path;
        EXPECT_EQ(c.turns[0].output_tokens, 20);
      }
    }
  }
}

TEST(Workload, SharedPrefixGroups) {
  const auto paths = tokenizer_paths();
  if (paths.empty()) GTEST_SKIP() << "no tokenizer on this machine";
  auto text = open_text(paths.front());
  auto b = PromptBuilder::create(text, true);
  ASSERT_TRUE(b.ok());
  WorkloadOptions o;
  o.dataset = "prefix";
  o.num_prompts = 10;
  o.num_prefix_groups = 3;
  o.prefix_len = 100;
  o.input_len = 30;
  auto convs = make_workload(o, **b);
  ASSERT_TRUE(convs.ok()) << convs.status().to_string();
  for (size_t i = 0; i < convs->size(); ++i) {
    const auto& c = (*convs)[i];
    EXPECT_EQ(c.group, static_cast<int>(i % 3));
    EXPECT_EQ(c.system, (*convs)[i % 3].system);
    EXPECT_EQ(c.system_tokens, 100);
    EXPECT_EQ(static_cast<int>(text->encode(c.system, true).size()), 100);
    // The whole prompt (system + suffix, as /v1/completions sends it) is prefix_len + input_len.
    EXPECT_EQ(static_cast<int>(text->encode(c.system + c.turns[0].text, true).size()), 130);
  }
  EXPECT_NE((*convs)[0].system, (*convs)[1].system);
}

TEST(Workload, MultiTurnAndTokenIdsAndSeeds) {
  auto b = PromptBuilder::create(nullptr, true);
  ASSERT_TRUE(b.ok());
  WorkloadOptions o;
  o.num_prompts = 5;
  o.input_len = 17;
  o.output_len = 9;
  auto convs = make_workload(o, **b);
  ASSERT_TRUE(convs.ok());
  for (const auto& c : *convs) {
    ASSERT_EQ(c.turns[0].token_ids.size(), 17u);
    for (int32_t id : c.turns[0].token_ids) {
      EXPECT_GE(id, o.min_token_id);
      EXPECT_LT(id, o.max_token_id);
    }
  }
  auto again = make_workload(o, **b);
  EXPECT_EQ((*again)[3].turns[0].token_ids, (*convs)[3].turns[0].token_ids);
  o.seed = 99;
  auto other = make_workload(o, **b);
  EXPECT_NE((*other)[3].turns[0].token_ids, (*convs)[3].turns[0].token_ids);
  o.dataset = "multi-turn";
  EXPECT_FALSE(make_workload(o, **b).ok());  // needs a tokenizer

  const auto paths = tokenizer_paths();
  if (paths.empty()) return;
  auto tb = PromptBuilder::create(open_text(paths.front()), false);
  ASSERT_TRUE(tb.ok());
  o.num_turns = 4;
  auto mt = make_workload(o, **tb);
  ASSERT_TRUE(mt.ok());
  for (const auto& c : *mt) {
    ASSERT_EQ(c.turns.size(), 4u);
    for (const auto& t : c.turns) {
      EXPECT_EQ(t.input_tokens, 17);
      EXPECT_EQ(t.output_tokens, 9);
    }
  }
}

TEST(Workload, LengthDistributions) {
  std::mt19937_64 rng(1);
  double sum_n = 0, sum_l = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const int u = draw_length(rng, "uniform", 100, 0.2, 0);
    EXPECT_GE(u, 80);
    EXPECT_LE(u, 120);
    sum_n += draw_length(rng, "normal", 100, 0, 10);
    const int l = draw_length(rng, "lognormal", 100, 0, 50);
    EXPECT_GE(l, 1);
    sum_l += l;
  }
  EXPECT_NEAR(sum_n / n, 100, 2);
  EXPECT_NEAR(sum_l / n, 100, 3);
  EXPECT_EQ(draw_length(rng, "uniform", 42, 0, 0), 42);
  EXPECT_EQ(draw_length(rng, "normal", 5, 0, 1000) >= 1, true);
}

TEST(Workload, ShareGpt) {
  const fs::path p = fs::path(::testing::TempDir()) / "osprey_bench_sharegpt.json";
  {
    std::ofstream f(p);
    f << R"([
      {"id": "a", "conversations": [{"from": "human", "value": "one two three four five six"},
                                    {"from": "gpt", "value": "seven eight nine ten eleven twelve thirteen"}]},
      {"id": "b", "conversations": [{"from": "gpt", "value": "wrong order"}, {"from": "human", "value": "x"}]},
      {"id": "c", "conversations": [{"from": "human", "value": "hi"}]},
      {"id": "d", "conversations": [{"from": "human", "value": "a b c d e f g h i j k l"},
                                    {"from": "gpt", "value": "m n o p q r s t u v"}]},
      "junk", 5, {"conversations": 3}
    ])";
  }
  auto b = PromptBuilder::create(nullptr, true);
  WorkloadOptions o;
  o.dataset = "sharegpt";
  o.dataset_path = p.string();
  o.num_prompts = 5;
  auto convs = make_workload(o, **b);
  ASSERT_TRUE(convs.ok()) << convs.status().to_string();
  ASSERT_EQ(convs->size(), 5u);  // two usable pairs, reused
  for (const auto& c : *convs) {
    const auto& t = c.turns[0];
    EXPECT_TRUE(t.text == "one two three four five six" || t.text == "a b c d e f g h i j k l");
    EXPECT_GE(t.output_tokens, 4);
  }
  o.sharegpt_output_len = 33;
  convs = make_workload(o, **b);
  for (const auto& c : *convs) EXPECT_EQ(c.turns[0].output_tokens, 33);
  o.dataset_path = p.string() + ".missing";
  EXPECT_FALSE(make_workload(o, **b).ok());
  {
    std::ofstream f(p);
    f << "{not json";
  }
  o.dataset_path = p.string();
  EXPECT_FALSE(make_workload(o, **b).ok());
}

TEST(Arrival, Schedules) {
  ArrivalOptions a;
  a.kind = "constant";
  a.rate = 4;
  auto t = arrival_times(a, 5);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, (std::vector<double>{0, 0.25, 0.5, 0.75, 1.0}));
  a.rate = std::numeric_limits<double>::infinity();
  EXPECT_EQ(*arrival_times(a, 3), (std::vector<double>{0, 0, 0}));
  a.kind = "burst";
  a.burst_size = 2;
  a.burst_interval_s = 0.5;
  EXPECT_EQ(*arrival_times(a, 5), (std::vector<double>{0, 0, 0.5, 0.5, 1.0}));
  a.kind = "poisson";
  a.rate = 10;
  a.seed = 3;
  t = arrival_times(a, 20001);
  ASSERT_TRUE(t.ok());
  for (size_t i = 1; i < t->size(); ++i) EXPECT_LE((*t)[i - 1], (*t)[i]);
  EXPECT_NEAR(t->back() / 20000, 0.1, 0.005);  // mean gap 1 / rate
  EXPECT_EQ(*arrival_times(a, 50), *arrival_times(a, 50));
  a.kind = "nope";
  EXPECT_FALSE(arrival_times(a, 3).ok());
}

TEST(Arrival, NumberLists) {
  auto v = parse_number_list("1, 2.5,inf");
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->size(), 3u);
  EXPECT_EQ((*v)[1], 2.5);
  EXPECT_TRUE(std::isinf((*v)[2]));
  EXPECT_FALSE(parse_number_list("").ok());
  EXPECT_FALSE(parse_number_list("1,x").ok());
  EXPECT_FALSE(parse_number_list("-1").ok());
  EXPECT_FALSE(parse_number_list("0").ok());
}

}  // namespace
}  // namespace osprey::bench
