#include <cmath>

#include "osprey/engine.h"

namespace osprey {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "";
}

Status SamplingParams::validate(int vocab_size) const {
  auto bad = [](std::string m) { return invalid_argument(std::move(m)); };
  if (n < 1 || n > 128) return bad("n must be in [1, 128], got " + std::to_string(n));
  if (max_tokens < 1) return bad("max_tokens must be at least 1, got " + std::to_string(max_tokens));
  if (min_tokens < 0 || min_tokens > max_tokens)
    return bad("min_tokens must be in [0, max_tokens], got " + std::to_string(min_tokens));
  if (!std::isfinite(temperature) || temperature < 0.0f)
    return bad("temperature must be >= 0, got " + std::to_string(temperature));
  if (!std::isfinite(top_p) || top_p <= 0.0f || top_p > 1.0f)
    return bad("top_p must be in (0, 1], got " + std::to_string(top_p));
  if (!std::isfinite(min_p) || min_p < 0.0f || min_p > 1.0f)
    return bad("min_p must be in [0, 1], got " + std::to_string(min_p));
  if (top_k < -1) return bad("top_k must be -1, 0 (off) or positive, got " + std::to_string(top_k));
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f)
    return bad("repetition_penalty must be > 0, got " + std::to_string(repetition_penalty));
  if (!std::isfinite(presence_penalty) || presence_penalty < -2.0f || presence_penalty > 2.0f)
    return bad("presence_penalty must be in [-2, 2], got " + std::to_string(presence_penalty));
  if (!std::isfinite(frequency_penalty) || frequency_penalty < -2.0f || frequency_penalty > 2.0f)
    return bad("frequency_penalty must be in [-2, 2], got " + std::to_string(frequency_penalty));
  for (const auto& [id, b] : logit_bias) {
    if (id < 0 || id >= vocab_size)
      return bad("logit_bias token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                 std::to_string(vocab_size) + ")");
    if (!std::isfinite(b)) return bad("logit_bias values must be finite");
  }
  for (int32_t id : stop_token_ids)
    if (id < 0 || id >= vocab_size)
      return bad("stop_token_ids entry " + std::to_string(id) + " is outside the vocabulary");
  if (logprobs < -1 || logprobs > 20) return bad("logprobs must be in [0, 20] (or -1: off), got " + std::to_string(logprobs));
  if (prompt_logprobs < -1 || prompt_logprobs > 20)
    return bad("prompt_logprobs must be in [0, 20] (or -1: off), got " + std::to_string(prompt_logprobs));
  for (const auto& s : stop)
    if (s.empty()) return bad("stop strings must not be empty");
  return Status::Ok();
}

}  // namespace osprey
