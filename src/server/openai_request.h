// Parsing and validation of the OpenAI request bodies the server accepts:
// /v1/chat/completions, /v1/completions, /tokenize and /detokenize. Pure
// functions of the JSON body and a few model limits, so they are unit-tested
// without an engine. Rules follow the OpenAI API: wrong types, out-of-range
// values and unknown parameters are 400 errors naming the parameter.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "osprey/engine.h"
#include "server/api_error.h"

namespace osprey::server {

enum class ApiKind { kChat, kCompletion };

// One prompt of a completions request: text or token ids.
struct PromptSpec {
  bool is_tokens = false;
  std::string text;
  std::vector<int32_t> token_ids;
};

struct GenerationRequest {
  ApiKind kind = ApiKind::kChat;
  std::string model;
  // Chat: validated messages (array of objects with a known role), tools
  // (null or array), extra template variables (object).
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;
  bool tool_choice_none = false;  // tool_choice "none": tools rendered, output not parsed for calls
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;
  // Completions: one engine request per prompt (choices prompt-major).
  std::vector<PromptSpec> prompts;
  bool echo = false;
  bool add_special_tokens = true;  // chat: false (the template places them)
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool continuous_usage_stats = false;  // stream_options.continuous_usage_stats (usage on every chunk)
  bool max_tokens_given = false;        // false: chat fills the context, completions use 16
  bool skip_special_tokens_given = false;  // the client set skip_special_tokens
  bool logprobs = false;                // chat: logprobs; completions: logprobs != null
  int top_logprobs = 0;                 // top alternatives per token when logprobs
  std::string user;
  SamplingParams params;  // max_tokens, n, sampling, stop, logprobs set
};

struct ParseLimits {
  int max_n = 128;        // largest n accepted
  int max_logprobs = 20;  // largest top_logprobs / logprobs accepted
  int vocab_size = 0;     // token ids and logit_bias keys must be < this (0: unchecked)
  int max_stop = 16;      // stop strings at most
};

ApiResult<GenerationRequest> parse_chat_request(const nlohmann::ordered_json& body, const ParseLimits& limits);
ApiResult<GenerationRequest> parse_completion_request(const nlohmann::ordered_json& body, const ParseLimits& limits);

// vLLM's /tokenize: {"model"?, "prompt"} or {"model"?, "messages", "add_generation_prompt"?}.
struct TokenizeRequest {
  std::string model;
  bool is_chat = false;
  std::string prompt;
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;
  bool add_special_tokens = true;  // chat: false unless given
  bool return_token_strs = false;
};
ApiResult<TokenizeRequest> parse_tokenize_request(const nlohmann::ordered_json& body, const ParseLimits& limits);

// vLLM's /detokenize: {"model"?, "tokens": [ids]}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
ApiResult<DetokenizeRequest> parse_detokenize_request(const nlohmann::ordered_json& body, const ParseLimits& limits);

}  // namespace osprey::server
