// The shared engine flags (tools/engine_options.h) through the real
// `generate`, `serve` and `bench offline` commands: every command accepts
// every shared flag with the same help text, and each maps onto the
// EngineConfig the command would create its engine with (the commands' dry
// run: nothing is loaded).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "engine_options.h"

namespace osprey::cli {
namespace {

// Each shared flag with a non-default value (flags: no value).
const std::vector<std::vector<std::string>> kSharedArgs = {
    {"--model", "models/some.gguf"},
    {"--tokenizer", "tok/tokenizer.json"},
    {"--device", "cuda:1"},
    {"--dtype", "float16"},
    {"--kv-cache-dtype", "bfloat16"},
    {"--calculate-kv-scales"},
    {"--load-format", "auto"},
    {"--threads", "3"},
    {"--max-num-seqs", "17"},
    {"--max-num-batched-tokens", "777"},
    {"--max-model-len", "4096"},
    {"--block-size", "32"},
    {"--kv-cache-mb", "96"},
    {"--gpu-memory-utilization", "0.5"},
    {"--swap-space-mb", "12"},
    {"--enforce-eager"},
    {"--no-async-scheduling"},
    {"--no-prefix-caching"},
    {"--no-chunked-prefill"},
    {"--quantize-activations"},
};

enum class Cmd { kGenerate, kServe, kBench, kPerplexity };

std::vector<std::string> command_words(Cmd c) {
  switch (c) {
    case Cmd::kGenerate:
      return {"generate", "--prompt", "hi"};
    case Cmd::kServe:
      return {"serve"};
    case Cmd::kBench:
      return {"bench", "offline"};
    case Cmd::kPerplexity:
      return {"perplexity", "--file", "text.txt"};
  }
  return {};
}

void register_command(CLI::App& app, Cmd c, EngineConfigSink sink) {
  switch (c) {
    case Cmd::kGenerate:
      add_generate_command(app, std::move(sink));
      break;
    case Cmd::kServe:
      add_serve_command(app, std::move(sink));
      break;
    case Cmd::kBench:
      add_bench_command(app, std::move(sink));
      break;
    case Cmd::kPerplexity:
      add_perplexity_command(app, std::move(sink));
      break;
  }
}

CLI::App* subcommand(CLI::App& app, Cmd c) {
  return c == Cmd::kBench ? app.get_subcommand("bench")->get_subcommand("offline")
                          : app.get_subcommand(command_words(c)[0]);
}

// Parses `osprey <command> <extra...>` through the real command; the
// EngineConfig its callback produced (nullopt: parse error or no callback).
std::optional<EngineConfig> parse(Cmd c, const std::vector<std::string>& extra, std::string* error = nullptr) {
  CLI::App app{"test"};
  app.require_subcommand(1);
  std::optional<EngineConfig> got;
  register_command(app, c, [&](const EngineConfig& cfg) { got = cfg; });
  std::vector<std::string> words = {"osprey"};
  for (const auto& w : command_words(c)) words.push_back(w);
  words.insert(words.end(), extra.begin(), extra.end());
  std::vector<const char*> argv;
  for (const auto& w : words) argv.push_back(w.c_str());
  exit_code() = -1;
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    if (error) *error = e.what();
    return std::nullopt;
  }
  EXPECT_EQ(exit_code(), 0);
  return got;
}

std::vector<std::string> all_shared_args() {
  std::vector<std::string> v;
  for (const auto& a : kSharedArgs) v.insert(v.end(), a.begin(), a.end());
  return v;
}

constexpr Cmd kCmds[] = {Cmd::kGenerate, Cmd::kServe, Cmd::kBench, Cmd::kPerplexity};
const char* name(Cmd c) {
  switch (c) {
    case Cmd::kGenerate:
      return "generate";
    case Cmd::kServe:
      return "serve";
    case Cmd::kBench:
      return "bench offline";
    case Cmd::kPerplexity:
      return "perplexity";
  }
  return "";
}

TEST(EngineOptions, EveryCommandMapsEverySharedFlag) {
  for (Cmd c : kCmds) {
    auto cfg = parse(c, all_shared_args());
    ASSERT_TRUE(cfg.has_value()) << name(c);
    EXPECT_EQ(cfg->model_path, "models/some.gguf") << name(c);
    EXPECT_EQ(cfg->tokenizer, "tok/tokenizer.json") << name(c);
    EXPECT_EQ(cfg->device, "cuda:1") << name(c);
    EXPECT_EQ(cfg->dtype, "float16") << name(c);
    EXPECT_EQ(cfg->kv_cache_dtype, "bfloat16") << name(c);
    EXPECT_TRUE(cfg->calculate_kv_scales) << name(c);
    EXPECT_EQ(cfg->load_format, "auto") << name(c);
    EXPECT_EQ(cfg->num_threads, 3) << name(c);
    EXPECT_EQ(cfg->max_num_seqs, 17) << name(c);
    EXPECT_EQ(cfg->max_num_batched_tokens, 777) << name(c);
    EXPECT_EQ(cfg->max_model_len, 4096) << name(c);
    EXPECT_EQ(cfg->block_size, 32) << name(c);
    EXPECT_EQ(cfg->kv_cache_bytes, int64_t{96} << 20) << name(c);
    EXPECT_TRUE(cfg->kv_cache_bytes_explicit) << name(c);
    EXPECT_DOUBLE_EQ(cfg->gpu_memory_utilization, 0.5) << name(c);
    EXPECT_EQ(cfg->swap_space_bytes, int64_t{12} << 20) << name(c);
    EXPECT_TRUE(cfg->enforce_eager) << name(c);
    EXPECT_FALSE(cfg->async_scheduling) << name(c);
    EXPECT_FALSE(cfg->enable_prefix_caching) << name(c);
    EXPECT_FALSE(cfg->enable_chunked_prefill) << name(c);
    EXPECT_TRUE(cfg->quantize_activations) << name(c);
  }
}

TEST(EngineOptions, EachFlagAloneReachesTheConfig) {
  // One flag at a time against the command's defaults: the flag lands in
  // EngineConfig (a field differs from the defaults) on every command.
  for (Cmd c : kCmds) {
    auto base = parse(c, {"--model", "m.gguf"});
    ASSERT_TRUE(base.has_value()) << name(c);
    for (const auto& a : kSharedArgs) {
      if (a[0] == "--model" || a[0] == "--load-format") continue;  // the base's own / the default value
      // perplexity always runs without the prefix cache (its own test below).
      if (c == Cmd::kPerplexity && a[0] == "--no-prefix-caching") continue;
      std::vector<std::string> args = {"--model", "m.gguf"};
      args.insert(args.end(), a.begin(), a.end());
      auto cfg = parse(c, args);
      ASSERT_TRUE(cfg.has_value()) << name(c) << " " << a[0];
      const bool changed =
          cfg->tokenizer != base->tokenizer || cfg->device != base->device || cfg->dtype != base->dtype ||
          cfg->kv_cache_dtype != base->kv_cache_dtype || cfg->calculate_kv_scales != base->calculate_kv_scales ||
          cfg->num_threads != base->num_threads ||
          cfg->max_num_seqs != base->max_num_seqs || cfg->max_num_batched_tokens != base->max_num_batched_tokens ||
          cfg->max_model_len != base->max_model_len || cfg->block_size != base->block_size ||
          cfg->kv_cache_bytes != base->kv_cache_bytes ||
          cfg->kv_cache_bytes_explicit != base->kv_cache_bytes_explicit ||
          cfg->gpu_memory_utilization != base->gpu_memory_utilization ||
          cfg->swap_space_bytes != base->swap_space_bytes || cfg->enforce_eager != base->enforce_eager ||
          cfg->async_scheduling != base->async_scheduling ||
          cfg->enable_prefix_caching != base->enable_prefix_caching ||
          cfg->enable_chunked_prefill != base->enable_chunked_prefill ||
          cfg->quantize_activations != base->quantize_activations;
      EXPECT_TRUE(changed) << name(c) << " ignores " << a[0];
    }
  }
}

TEST(EngineOptions, DefaultsAreTheEnginesAndEachCommandsOwn) {
  const EngineConfig def;
  for (Cmd c : kCmds) {
    auto cfg = parse(c, {"--model", "m.gguf"});
    ASSERT_TRUE(cfg.has_value()) << name(c);
    EXPECT_EQ(cfg->device, "cpu") << name(c);
    EXPECT_EQ(cfg->dtype, "auto") << name(c);
    EXPECT_EQ(cfg->kv_cache_dtype, "auto") << name(c);
    EXPECT_FALSE(cfg->calculate_kv_scales) << name(c);
    EXPECT_EQ(cfg->load_format, "auto") << name(c);
    EXPECT_EQ(cfg->tokenizer, "") << name(c);
    EXPECT_EQ(cfg->num_threads, 0) << name(c);
    EXPECT_EQ(cfg->max_num_batched_tokens, 2048) << name(c);
    EXPECT_EQ(cfg->max_model_len, 0) << name(c);
    EXPECT_EQ(cfg->block_size, 16) << name(c);
    EXPECT_EQ(cfg->kv_cache_bytes, int64_t{1} << 30) << name(c);
    EXPECT_FALSE(cfg->kv_cache_bytes_explicit) << name(c);
    EXPECT_DOUBLE_EQ(cfg->gpu_memory_utilization, 0.90) << name(c);
    EXPECT_EQ(cfg->swap_space_bytes, 0) << name(c);
    EXPECT_FALSE(cfg->enforce_eager) << name(c);
    EXPECT_TRUE(cfg->async_scheduling) << name(c);
    EXPECT_EQ(cfg->enable_prefix_caching, c != Cmd::kPerplexity) << name(c);
    EXPECT_TRUE(cfg->enable_chunked_prefill) << name(c);
    EXPECT_FALSE(cfg->quantize_activations) << name(c);
    EXPECT_EQ(cfg->seed, 0u) << name(c);
    // bench offline: as many running sequences as concurrent prompts.
    EXPECT_EQ(cfg->max_num_seqs, c == Cmd::kBench ? 32 : def.max_num_seqs) << name(c);
  }
  EXPECT_EQ(parse(Cmd::kBench, {"--model", "m.gguf", "--num-prompts", "5"}).value().max_num_seqs, 5);
  EXPECT_EQ(parse(Cmd::kBench, {"--model", "m.gguf", "--num-prompts", "5", "--max-num-seqs", "2"}).value().max_num_seqs,
            2);
  EXPECT_EQ(parse(Cmd::kServe, {"--model", "m.gguf", "--max-num-seqs", "0"}).value().max_num_seqs, def.max_num_seqs);
}

TEST(EngineOptions, SeedStaysWithItsCommand) {
  // serve: the engine's base seed; generate: the request's (not the engine's).
  EXPECT_EQ(parse(Cmd::kServe, {"--model", "m.gguf", "--seed", "99"}).value().seed, 99u);
  EXPECT_EQ(parse(Cmd::kGenerate, {"--model", "m.gguf", "--seed", "99"}).value().seed, 0u);
  EXPECT_EQ(parse(Cmd::kBench, {"--model", "m.gguf", "--seed", "99"}).value().seed, 0u);
}

TEST(EngineOptions, PerplexityComputesEveryPositionWithWideLogprobSteps) {
  // Scored positions must not come from the prefix cache; prompt-logprob
  // rows per step follow the token budget up to 1024.
  auto cfg = parse(Cmd::kPerplexity, {"--model", "m.gguf"});
  ASSERT_TRUE(cfg.has_value());
  EXPECT_FALSE(cfg->enable_prefix_caching);
  EXPECT_EQ(cfg->max_prompt_logprob_rows, 1024);
  cfg = parse(Cmd::kPerplexity, {"--model", "m.gguf", "--max-num-batched-tokens", "300"});
  ASSERT_TRUE(cfg.has_value());
  EXPECT_EQ(cfg->max_prompt_logprob_rows, 300);
  std::string error;
  EXPECT_FALSE(parse(Cmd::kPerplexity, {"--ctx", "1"}, &error).has_value());
  EXPECT_FALSE(error.empty());
}

TEST(EngineOptions, DummyModelIsNotResolved) {
  for (Cmd c : kCmds) {
    auto cfg = parse(c, {"--model", "llama-3-8b", "--load-format", "dummy"});
    ASSERT_TRUE(cfg.has_value()) << name(c);
    EXPECT_EQ(cfg->model_path, "llama-3-8b") << name(c);
    EXPECT_EQ(cfg->load_format, "dummy") << name(c);
  }
}

TEST(EngineOptions, OneHelpTextPerFlag) {
  CLI::App app{"test"};
  for (Cmd c : kCmds) register_command(app, c, [](const EngineConfig&) {});
  for (const auto& a : kSharedArgs) {
    const std::string want = subcommand(app, Cmd::kServe)->get_option(a[0])->get_description();
    EXPECT_FALSE(want.empty()) << a[0];
    for (Cmd c : kCmds) EXPECT_EQ(subcommand(app, c)->get_option(a[0])->get_description(), want) << name(c) << a[0];
  }
}

TEST(EngineOptions, OutOfRangeValuesAreRejected) {
  for (Cmd c : kCmds) {
    for (std::vector<std::string> bad : {std::vector<std::string>{"--block-size", "0"},
                                         {"--block-size", "2048"},
                                         {"--gpu-memory-utilization", "1.5"},
                                         {"--max-num-batched-tokens", "0"},
                                         {"--kv-cache-mb", "0"},
                                         {"--swap-space-mb", "-1"},
                                         {"--max-model-len", "-5"},
                                         {"--max-num-seqs", "-1"},
                                         {"--threads", "many"}}) {
      std::string error;
      EXPECT_FALSE(parse(c, bad, &error).has_value()) << name(c) << " " << bad[0] << " " << bad[1];
      EXPECT_FALSE(error.empty());
    }
  }
}

TEST(EngineOptions, ToEngineConfigDirectly) {
  EngineOptions o;
  EngineConfig c = to_engine_config(o);
  const EngineConfig def;
  EXPECT_EQ(c.model_path, "default");
  EXPECT_EQ(c.max_num_seqs, def.max_num_seqs);
  EXPECT_EQ(c.kv_cache_bytes, def.kv_cache_bytes);
  o.max_num_seqs = 3;
  o.kv_cache_mb = 2;
  o.kv_cache_mb_set = true;
  c = to_engine_config(o);
  EXPECT_EQ(c.max_num_seqs, 3);
  EXPECT_EQ(c.kv_cache_bytes, int64_t{2} << 20);
  EXPECT_TRUE(c.kv_cache_bytes_explicit);
}

}  // namespace
}  // namespace osprey::cli
