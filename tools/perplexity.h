// `osprey perplexity`: the windows a text's tokens are cut into, the scores
// of their tokens, and the statistics over them (tools/cmd_perplexity.cpp
// runs the engine; this part is pure and unit-tested).
//
// A window is `prefix` (the tokens the tokenizer puts before a text, e.g.
// BOS; often none) followed by the next ctx - |prefix| tokens of the text;
// windows do not overlap and only whole ones are scored. In each window the
// tokens at positions score_from .. ctx - 1 are scored (each with at least
// score_from tokens of context), by the log-probability the model gives them
// after the window's tokens before them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "osprey/status.h"

namespace osprey::cli {

struct PerplexityPlan {
  int ctx = 0;                  // tokens per window, prefix included
  int score_from = 0;           // first scored position in a window
  std::vector<int32_t> prefix;  // the tokens each window starts with
  int stride = 0;               // text tokens per window (ctx - |prefix|)
  int num_windows = 0;
};

// score_from < 0: ctx / 2 (at least |prefix| and 1). max_windows <= 0: all
// whole windows. Errors: ctx too small for the prefix, score_from outside
// [max(1, |prefix|), ctx), a text shorter than one window.
Expected<PerplexityPlan> plan_perplexity(size_t num_text_tokens, int ctx, int score_from, std::vector<int32_t> prefix,
                                         int max_windows);

// The tokens of window w (prefix + its slice of the text).
std::vector<int32_t> window_tokens(const PerplexityPlan& plan, std::span<const int32_t> text_ids, int w);

// One scored token: its id, -log p(token | the window before it), and the
// model's most likely token at that position.
struct ScoredToken {
  int32_t token = 0;
  double nll = 0;
  int32_t top1 = 0;
};

struct PerplexityStats {
  int64_t count = 0;
  double mean_nll = 0;    // nats per token
  double stderr_nll = 0;  // standard error of the mean (sample standard deviation / sqrt(count))
  double ppl = 0;         // exp(mean_nll)
  double ppl_err = 0;     // ppl * stderr_nll (first order)
  double top1 = 0;        // fraction of tokens that were the model's most likely token
};

PerplexityStats summarize(std::span<const ScoredToken> tokens);

// The same tokens scored twice (e.g. a quantised configuration against a
// full-precision one): paired differences, whose error is far smaller than
// either run's own.
struct PerplexityComparison {
  int64_t count = 0;
  double ppl_ratio = 0;        // exp(mean nll - mean base nll)
  double mean_dnll = 0;        // mean of nll - base nll
  double stderr_dnll = 0;      // its standard error
  double mean_abs_dnll = 0;    // mean |nll - base nll|
  double same_top1 = 0;        // fraction of positions with the same most likely token
};

// Errors when the two runs did not score the same tokens.
Expected<PerplexityComparison> compare(std::span<const ScoredToken> run, std::span<const ScoredToken> base);

// The saved form of a run (`--save`): a JSON object with the plan and every
// scored token, read back by `--compare`. Reading checks every field and
// size (the file is input like any other).
std::string scores_to_json(const PerplexityPlan& plan, std::span<const ScoredToken> tokens);
Expected<std::vector<ScoredToken>> scores_from_json(const std::string& text);

}  // namespace osprey::cli
