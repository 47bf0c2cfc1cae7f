// Benchmark workloads: prompts of exact token lengths (built with the model's
// own tokenizer), random length distributions, ShareGPT files, shared-prefix
// groups and multi-turn conversations. Everything is a function of the seed.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "osprey/status.h"

namespace osprey {
class TextProcessor;
}

namespace osprey::bench {

// One user turn: the new text (or token ids when there is no tokenizer) and the
// lengths asked for. input_tokens counts this turn's new tokens (the whole prompt
// for single-turn workloads; the first turn of a shared-prefix workload includes
// the group's system prompt when the prompt is sent as one string).
struct Turn {
  std::string text;
  std::vector<int32_t> token_ids;  // used instead of text when non-empty
  int input_tokens = 0;
  int output_tokens = 0;
};

// A conversation is sent turn by turn: turn k+1 goes out when turn k's answer
// is complete, with every previous user turn and answer in its context.
// Single-turn workloads are conversations of one turn.
struct Conversation {
  std::string system;  // shared system prompt ("" : none)
  int system_tokens = 0;
  int group = -1;      // shared-prefix group, or -1
  std::vector<Turn> turns;
};

struct WorkloadOptions {
  std::string dataset = "random";  // "random" | "sharegpt" | "prefix" | "multi-turn"
  int num_prompts = 100;
  uint64_t seed = 0;
  // Lengths (random, prefix, multi-turn): means of the distribution.
  int input_len = 128;
  int output_len = 128;
  std::string dist = "uniform";    // "uniform" | "normal" | "lognormal"
  double range_ratio = 0.0;        // uniform: [mean * (1 - r), mean * (1 + r)]; 0: fixed lengths
  double input_std = 0.0;          // normal / lognormal spread, tokens
  double output_std = 0.0;
  // prefix: num_prefix_groups system prompts of prefix_len tokens; request i uses group i % k.
  int num_prefix_groups = 4;
  int prefix_len = 512;
  // multi-turn: turns per conversation (each turn: input_len / output_len as above).
  int num_turns = 3;
  // sharegpt
  std::string dataset_path;
  int sharegpt_output_len = 0;     // > 0: override the answer lengths from the file
  int max_prompt_len = 1024;       // ShareGPT filter, as vLLM's benchmark does
  int max_total_len = 2048;
  // How prompt lengths are counted: with the tokenizer's special tokens (BOS)
  // for /v1/completions, without them for chat message contents.
  bool count_special_tokens = true;
  // Token-id prompts (no tokenizer): ids drawn uniformly from [min_token_id, max_token_id).
  int min_token_id = 100;
  int max_token_id = 10000;
};

// Builds prompt text of an exact token length from common English words that
// are single tokens in the model's vocabulary (after a space).
class PromptBuilder {
 public:
  // text: the tokenizer (null: token-id prompts only).
  static Expected<std::unique_ptr<PromptBuilder>> create(std::shared_ptr<const TextProcessor> text,
                                                         bool count_special_tokens);
  bool has_tokenizer() const { return text_ != nullptr; }
  // Text of num_tokens tokens where the tokenizer allows (*actual: the count
  // reached). Without a prefix the whole text is counted, special tokens
  // included when count_special_tokens; with one, the tokens that prefix + text
  // has beyond the prefix alone (the text starts with a space).
  std::string make_text(std::mt19937_64& rng, int num_tokens, const std::string& prefix, int* actual) const;
  int count_tokens(const std::string& text) const;

 private:
  PromptBuilder() = default;
  std::string join(const std::vector<int>& words, bool leading_space) const;

  std::shared_ptr<const TextProcessor> text_;
  bool count_special_ = true;
  int num_special_ = 0;            // tokens the tokenizer adds around a text (BOS), when counted
  std::vector<std::string> words_;  // each " " + word is one token
};

// Draws a length around `mean` (>= 1).
int draw_length(std::mt19937_64& rng, const std::string& dist, int mean, double range_ratio, double stddev);

// The workload's conversations; builder may lack a tokenizer only for
// "random" (token-id prompts).
Expected<std::vector<Conversation>> make_workload(const WorkloadOptions& options, const PromptBuilder& builder);

}  // namespace osprey::bench
