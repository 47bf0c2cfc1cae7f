#include "server/openai_request.h"

#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "server/json_util.h"

namespace osprey::server {

namespace {

using json = nlohmann::ordered_json;
using Err = std::optional<ApiError>;

#define OSP_API_TRY(expr)           \
  do {                              \
    Err osp_err_ = (expr);          \
    if (osp_err_) return *osp_err_; \
  } while (0)

std::string type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a decimal";
    default:
      return "an integer";
  }
}

std::string number_text(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return json(v).dump();
}

ApiError type_error(const std::string& param, const char* expected, const json& got) {
  return bad_request(
      "Invalid type for '" + param + "': expected " + expected + ", but got " + type_name(got) + " instead.", param,
      "invalid_type");
}

ApiError range_error(const std::string& param, const char* what, bool below, double bound, double got) {
  return bad_request("Invalid '" + param + "': " + what + (below ? " below minimum" : " above maximum") +
                         " value. Expected a value " + (below ? ">= " : "<= ") + number_text(bound) + ", but got " +
                         number_text(got) + " instead.",
                     param, below ? "integer_below_min_value" : "integer_above_max_value");
}

// obj[key] when it is a string, else "" (never throws, unlike json::value()).
std::string string_field(const json& obj, const char* key) {
  if (!obj.is_object()) return {};
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// An integer (or a decimal with an integral value) in [lo, hi].
Err as_int(const json& v, const std::string& param, int64_t lo, int64_t hi, int64_t& out) {
  double d;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return range_error(param, "integer", false, static_cast<double>(hi), v.get<double>());
    out = v.get<int64_t>();
  } else if (v.is_number_float()) {
    d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return type_error(param, "an integer", v);
    if (d < static_cast<double>(lo)) return range_error(param, "integer", true, static_cast<double>(lo), d);
    if (d > static_cast<double>(hi)) return range_error(param, "integer", false, static_cast<double>(hi), d);
    out = static_cast<int64_t>(d);
  } else {
    return type_error(param, "an integer", v);
  }
  if (out < lo) return range_error(param, "integer", true, static_cast<double>(lo), static_cast<double>(out));
  if (out > hi) return range_error(param, "integer", false, static_cast<double>(hi), static_cast<double>(out));
  return std::nullopt;
}

Err read_int(const json& body, const char* key, int64_t lo, int64_t hi, int64_t& out, bool* present = nullptr) {
  const json* v = field(body, key);
  if (present) *present = v != nullptr;
  if (!v) return std::nullopt;
  return as_int(*v, key, lo, hi, out);
}

Err read_int32(const json& body, const char* key, int64_t lo, int64_t hi, int& out, bool* present = nullptr) {
  int64_t v = out;
  OSP_API_TRY(read_int(body, key, lo, hi, v, present));
  out = static_cast<int>(v);
  return std::nullopt;
}

Err read_float(const json& body, const char* key, double lo, double hi, float& out, bool* present = nullptr) {
  const json* v = field(body, key);
  if (present) *present = v != nullptr;
  if (!v) return std::nullopt;
  if (!v->is_number()) return type_error(key, "a decimal", *v);
  const double d = v->get<double>();
  if (std::isnan(d)) return type_error(key, "a decimal", *v);
  if (d < lo) return range_error(key, "decimal", true, lo, d);
  if (d > hi) return range_error(key, "decimal", false, hi, d);
  out = static_cast<float>(d);
  return std::nullopt;
}

Err read_bool(const json& body, const char* key, bool& out) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return type_error(key, "a boolean", *v);
  out = v->get<bool>();
  return std::nullopt;
}

Err read_string(const json& body, const char* key, std::string& out) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) return type_error(key, "a string", *v);
  out = v->get<std::string>();
  return std::nullopt;
}

Err check_known(const json& body, const std::set<std::string>& known) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (!known.count(it.key()))
      return bad_request("Unrecognized request argument supplied: " + it.key(), it.key(), "unknown_parameter");
  }
  return std::nullopt;
}

Err read_model(const json& body, std::string& model, bool required) {
  const json* v = field(body, "model");
  if (!v) {
    if (!required) return std::nullopt;
    return bad_request("You must provide a model parameter.", "model", "missing_required_parameter");
  }
  if (!v->is_string()) return type_error("model", "a string", *v);
  model = v->get<std::string>();
  return std::nullopt;
}

Err check_token_id(const json& t, const std::string& param, const ParseLimits& limits, int32_t& out) {
  int64_t id = 0;
  const int64_t hi = limits.vocab_size > 0 ? limits.vocab_size - 1 : std::numeric_limits<int32_t>::max();
  if (!t.is_number_integer() && !(t.is_number_float())) return type_error(param, "an integer token id", t);
  if (Err e = as_int(t, param, 0, hi, id)) {
    e->message = "Invalid token id in '" + param + "': expected an integer in [0, " + std::to_string(hi) + "], got " +
                 t.dump() + ".";
    return e;
  }
  out = static_cast<int32_t>(id);
  return std::nullopt;
}

Err read_token_ids(const json& v, const std::string& param, const ParseLimits& limits, std::vector<int32_t>& out) {
  if (!v.is_array()) return type_error(param, "an array of token ids", v);
  out.clear();
  out.reserve(v.size());
  for (const json& t : v) {
    int32_t id = 0;
    OSP_API_TRY(check_token_id(t, param, limits, id));
    out.push_back(id);
  }
  return std::nullopt;
}

// An assistant message's tool_calls: [{"id"?, "type": "function", "function":
// {"name", "arguments"}}]. `arguments` arrives as the JSON text of an object
// (the OpenAI shape); templates print it with `| tojson` and expect the
// object itself (as transformers callers pass it), so text that parses as a
// JSON object is replaced by that object. Other text is left as it is.
Err check_tool_calls(json& calls, const std::string& where) {
  if (!calls.is_array()) return type_error(where, "an array", calls);
  for (size_t k = 0; k < calls.size(); ++k) {
    json& c = calls[k];
    const std::string cw = where + "[" + std::to_string(k) + "]";
    if (!c.is_object()) return type_error(cw, "an object", c);
    auto type = c.find("type");
    if (type != c.end() && !type->is_null() && *type != "function")
      return bad_request("Invalid '" + cw + ".type': only 'function' is supported.", cw + ".type", "invalid_value");
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object())
      return bad_request("Missing required parameter: '" + cw + ".function'.", cw + ".function",
                         "missing_required_parameter");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string())
      return type_error(cw + ".function.name", "a string", name == fn->end() ? json() : *name);
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) continue;
    if (args->is_string()) {
      const std::string& text = args->get_ref<const std::string&>();
      if (json_max_depth(text, kMaxJsonDepth) > kMaxJsonDepth) continue;
      json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_object()) *args = std::move(parsed);
    } else if (!args->is_object()) {
      return type_error(cw + ".function.arguments", "a string", *args);
    }
  }
  return std::nullopt;
}

// Normalises one chat message in place: content as a string (text parts
// joined by "\n"), role checked.
Err check_message(json& m, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return type_error(where, "an object", m);
  auto role_it = m.find("role");
  if (role_it == m.end() || role_it->is_null())
    return bad_request("Missing required parameter: '" + where + ".role'.", where + ".role",
                       "missing_required_parameter");
  if (!role_it->is_string()) return type_error(where + ".role", "a string", *role_it);
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool", "function"};
  const std::string role = role_it->get<std::string>();
  if (!kRoles.count(role))
    return bad_request("Invalid value: '" + role +
                           "'. Supported values are: 'system', 'developer', 'user', "
                           "'assistant', 'tool' and 'function'.",
                       where + ".role", "invalid_value");
  if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
    if (role != "assistant")
      return bad_request("Only 'assistant' messages may carry 'tool_calls'.", where + ".tool_calls", "invalid_value");
    OSP_API_TRY(check_tool_calls(*calls, where + ".tool_calls"));
  }
  auto content = m.find("content");
  const bool may_omit = role == "assistant";
  if (content == m.end() || content->is_null()) {
    if (!may_omit)
      return bad_request("Missing required parameter: '" + where + ".content'.", where + ".content",
                         "missing_required_parameter");
    return std::nullopt;
  }
  if (content->is_string()) return std::nullopt;
  if (!content->is_array()) return type_error(where + ".content", "a string or an array of content parts", *content);
  std::string joined;
  for (size_t k = 0; k < content->size(); ++k) {
    const json& part = (*content)[k];
    const std::string pw = where + ".content[" + std::to_string(k) + "]";
    if (!part.is_object()) return type_error(pw, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string())
      return bad_request("Missing required parameter: '" + pw + ".type'.", pw + ".type", "missing_required_parameter");
    if (*type != "text")
      return bad_request(
          "Content parts of type '" + type->get<std::string>() + "' are not supported by this model; only 'text' is.",
          pw + ".type", "unsupported_content_type");
    auto text = part.find("text");
    if (text == part.end() || !text->is_string())
      return type_error(pw + ".text", "a string", text == part.end() ? json() : *text);
    if (k) joined += "\n";
    joined += text->get<std::string>();
  }
  *content = joined;
  return std::nullopt;
}

Err read_messages(const json& body, json& messages) {
  const json* v = field(body, "messages");
  if (!v) return bad_request("Missing required parameter: 'messages'.", "messages", "missing_required_parameter");
  if (!v->is_array()) return type_error("messages", "an array", *v);
  if (v->empty())
    return bad_request(
        "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty "
        "array instead.",
        "messages", "empty_array");
  messages = *v;
  for (size_t i = 0; i < messages.size(); ++i) OSP_API_TRY(check_message(messages[i], i));
  return std::nullopt;
}

Err read_tools(const json& body, json& tools, bool& tool_choice_none) {
  const json* choice = field(body, "tool_choice");
  if (choice) {
    if (!(choice->is_string() || choice->is_object()))
      return type_error("tool_choice", "a string or an object", *choice);
    if (!(choice->is_string() && (*choice == "none" || *choice == "auto")))
      return bad_request(
          "Only 'auto' and 'none' are supported for 'tool_choice': 'required' and a named function need "
          "constrained decoding, which this server does not have.",
          "tool_choice", "unsupported_value");
    tool_choice_none = *choice == "none";
  }
  const json* v = field(body, "tools");
  if (!v) return std::nullopt;
  if (!v->is_array()) return type_error("tools", "an array", *v);
  for (size_t i = 0; i < v->size(); ++i) {
    const json& t = (*v)[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return type_error(where, "an object", t);
    auto fn = t.find("function");
    if (string_field(t, "type") != "function" || fn == t.end() || !fn->is_object() || !fn->contains("name") ||
        !(*fn)["name"].is_string())
      return bad_request("Invalid '" + where + "': expected {\"type\": \"function\", \"function\": {\"name\": ...}}.",
                         where, "invalid_value");
  }
  if (!v->empty()) tools = *v;
  return std::nullopt;
}

Err read_stop(const json& body, const ParseLimits& limits, std::vector<std::string>& stop) {
  const json* v = field(body, "stop");
  if (!v) return std::nullopt;
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const json& s : *v) {
      if (!s.is_string()) return type_error("stop", "a string or an array of strings", *v);
      out.push_back(s.get<std::string>());
    }
  } else {
    return type_error("stop", "a string or an array of strings", *v);
  }
  if (static_cast<int>(out.size()) > limits.max_stop)
    return bad_request("Invalid 'stop': at most " + std::to_string(limits.max_stop) + " stop strings are supported.",
                       "stop", "array_above_max_length");
  for (const std::string& s : out)
    if (s.empty()) return bad_request("Invalid 'stop': stop strings must not be empty.", "stop", "invalid_value");
  stop = std::move(out);
  return std::nullopt;
}

Err read_logit_bias(const json& body, const ParseLimits& limits, std::map<int32_t, float>& bias) {
  const json* v = field(body, "logit_bias");
  if (!v) return std::nullopt;
  if (!v->is_object()) return type_error("logit_bias", "an object", *v);
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string& key = it.key();
    bool digits = !key.empty() && key.size() <= 10;
    for (char c : key) digits = digits && c >= '0' && c <= '9';
    const int64_t id = digits ? std::stoll(key) : -1;
    if (!digits || id > std::numeric_limits<int32_t>::max() || (limits.vocab_size > 0 && id >= limits.vocab_size))
      return bad_request(
          "Invalid key in 'logit_bias': '" + key + "' is not a token id of this model" +
              (limits.vocab_size > 0 ? " (vocabulary size " + std::to_string(limits.vocab_size) + ")" : std::string()) +
              ".",
          "logit_bias", "invalid_value");
    if (!it->is_number()) return type_error("logit_bias." + key, "a number", *it);
    const double b = it->get<double>();
    if (!(b >= -100.0 && b <= 100.0))
      return range_error("logit_bias." + key, "decimal", b < -100.0, b < -100.0 ? -100.0 : 100.0, b);
    bias[static_cast<int32_t>(id)] = static_cast<float>(b);
  }
  return std::nullopt;
}

Err read_stream(const json& body, GenerationRequest& r) {
  OSP_API_TRY(read_bool(body, "stream", r.stream));
  const json* so = field(body, "stream_options");
  if (!so) return std::nullopt;
  if (!r.stream)
    return bad_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options",
                       "invalid_value");
  if (!so->is_object()) return type_error("stream_options", "an object", *so);
  OSP_API_TRY(check_known(*so, {"include_usage", "continuous_usage_stats", "include_obfuscation"}));
  OSP_API_TRY(read_bool(*so, "include_usage", r.include_usage));
  OSP_API_TRY(read_bool(*so, "continuous_usage_stats", r.continuous_usage_stats));
  bool obfuscation = false;
  OSP_API_TRY(read_bool(*so, "include_obfuscation", obfuscation));
  return std::nullopt;
}

// Fields shared by chat and completions.
Err read_common(const json& body, const ParseLimits& limits, GenerationRequest& r) {
  SamplingParams& p = r.params;
  OSP_API_TRY(read_model(body, r.model, true));
  OSP_API_TRY(read_stream(body, r));
  OSP_API_TRY(read_int32(body, "n", 1, limits.max_n, p.n));
  OSP_API_TRY(read_float(body, "temperature", 0.0, 2.0, p.temperature));
  OSP_API_TRY(read_float(body, "top_p", 0.0, 1.0, p.top_p));
  if (p.top_p <= 0.0f) p.top_p = 1e-6f;  // OpenAI accepts 0: keep only the most likely token
  OSP_API_TRY(read_float(body, "presence_penalty", -2.0, 2.0, p.presence_penalty));
  OSP_API_TRY(read_float(body, "frequency_penalty", -2.0, 2.0, p.frequency_penalty));
  int64_t seed = 0;
  bool has_seed = false;
  OSP_API_TRY(read_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), seed,
                       &has_seed));
  if (has_seed) p.seed = static_cast<uint64_t>(seed);
  OSP_API_TRY(read_stop(body, limits, p.stop));
  OSP_API_TRY(read_logit_bias(body, limits, p.logit_bias));
  OSP_API_TRY(read_string(body, "user", r.user));
  // Extensions (vLLM's names).
  int64_t top_k = 0;
  OSP_API_TRY(read_int(body, "top_k", -1, std::numeric_limits<int32_t>::max(), top_k));
  p.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  OSP_API_TRY(read_float(body, "min_p", 0.0, 1.0, p.min_p));
  bool has_rep = false;
  OSP_API_TRY(read_float(body, "repetition_penalty", 0.0, 100.0, p.repetition_penalty, &has_rep));
  if (has_rep && p.repetition_penalty <= 0.0f)
    return bad_request("Invalid 'repetition_penalty': must be > 0.", "repetition_penalty", "invalid_value");
  OSP_API_TRY(read_bool(body, "ignore_eos", p.ignore_eos));
  OSP_API_TRY(read_bool(body, "skip_special_tokens", p.skip_special_tokens));
  OSP_API_TRY(read_bool(body, "include_stop_str_in_output", p.include_stop_str_in_output));
  if (const json* ids = field(body, "stop_token_ids"))
    OSP_API_TRY(read_token_ids(*ids, "stop_token_ids", limits, p.stop_token_ids));
  OSP_API_TRY(read_bool(body, "add_special_tokens", r.add_special_tokens));
  return std::nullopt;
}

Err read_max_tokens(const json& body, GenerationRequest& r, bool chat) {
  const int64_t kMax = std::numeric_limits<int32_t>::max();
  int64_t v = 0;
  bool has = false;
  if (chat) {
    OSP_API_TRY(read_int(body, "max_completion_tokens", 1, kMax, v, &has));
    if (!has) OSP_API_TRY(read_int(body, "max_tokens", 1, kMax, v, &has));
  } else {
    OSP_API_TRY(read_int(body, "max_tokens", 1, kMax, v, &has));
  }
  r.max_tokens_given = has;
  r.params.max_tokens = has ? static_cast<int>(v) : 16;
  int64_t min_tokens = 0;
  OSP_API_TRY(read_int(body, "min_tokens", 0, kMax, min_tokens));
  if (has && min_tokens > v)
    return bad_request("Invalid 'min_tokens': " + std::to_string(min_tokens) + " is larger than the maximum of " +
                           std::to_string(v) + " tokens.",
                       "min_tokens", "invalid_value");
  r.params.min_tokens = static_cast<int>(min_tokens);
  return std::nullopt;
}

Err reject_unless(const json& body, const char* key, const std::function<bool(const json&)>& allowed, const char* why) {
  const json* v = field(body, key);
  if (v && !allowed(*v))
    return bad_request(std::string("Unsupported value for '") + key + "': " + why, key, "unsupported_value");
  return std::nullopt;
}

}  // namespace

ApiResult<GenerationRequest> parse_chat_request(const json& body, const ParseLimits& limits) {
  static const std::set<std::string> kKnown = {
      // OpenAI
      "model", "messages", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
      "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
      "presence_penalty", "reasoning_effort", "response_format", "seed", "service_tier", "stop", "store", "stream",
      "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user", "web_search_options",
      "prompt_cache_key", "safety_identifier", "verbosity",
      // extensions
      "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "skip_special_tokens",
      "include_stop_str_in_output", "stop_token_ids", "add_generation_prompt", "chat_template_kwargs",
      "add_special_tokens"};
  GenerationRequest r;
  r.kind = ApiKind::kChat;
  r.add_special_tokens = false;
  OSP_API_TRY(check_known(body, kKnown));
  OSP_API_TRY(read_common(body, limits, r));
  OSP_API_TRY(read_messages(body, r.messages));
  OSP_API_TRY(read_tools(body, r.tools, r.tool_choice_none));
  r.skip_special_tokens_given = field(body, "skip_special_tokens") != nullptr;
  OSP_API_TRY(read_max_tokens(body, r, true));
  OSP_API_TRY(read_bool(body, "logprobs", r.logprobs));
  bool has_top = false;
  OSP_API_TRY(read_int32(body, "top_logprobs", 0, limits.max_logprobs, r.top_logprobs, &has_top));
  if (has_top && !r.logprobs)
    return bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs", "invalid_value");
  r.params.logprobs = r.logprobs ? r.top_logprobs : -1;
  OSP_API_TRY(read_bool(body, "add_generation_prompt", r.add_generation_prompt));
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) return type_error("chat_template_kwargs", "an object", *kw);
    r.chat_template_kwargs = *kw;
  }
  OSP_API_TRY(reject_unless(
      body, "response_format", [](const json& v) { return string_field(v, "type") == "text"; },
      "only {\"type\": \"text\"} is supported."));
  OSP_API_TRY(reject_unless(
      body, "modalities", [](const json& v) { return v.is_array() && v.size() == 1 && v[0] == "text"; },
      "only [\"text\"] is supported."));
  for (const char* k : {"audio", "prediction", "functions", "function_call", "web_search_options"})
    OSP_API_TRY(reject_unless(
        body, k, [](const json&) { return false; }, "not supported by this server."));
  return r;
}

ApiResult<GenerationRequest> parse_completion_request(const json& body, const ParseLimits& limits) {
  static const std::set<std::string> kKnown = {
      // OpenAI
      "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
      "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
      // extensions
      "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "skip_special_tokens",
      "include_stop_str_in_output", "stop_token_ids", "add_special_tokens"};
  GenerationRequest r;
  r.kind = ApiKind::kCompletion;
  OSP_API_TRY(check_known(body, kKnown));
  OSP_API_TRY(read_common(body, limits, r));
  OSP_API_TRY(read_max_tokens(body, r, false));
  OSP_API_TRY(read_bool(body, "echo", r.echo));
  bool has_lp = false;
  OSP_API_TRY(read_int32(body, "logprobs", 0, limits.max_logprobs, r.top_logprobs, &has_lp));
  r.logprobs = has_lp;
  r.params.logprobs = has_lp ? r.top_logprobs : -1;
  if (r.echo && has_lp) r.params.prompt_logprobs = r.top_logprobs;
  int64_t best_of = r.params.n;
  OSP_API_TRY(read_int(body, "best_of", 1, limits.max_n, best_of));
  if (best_of != r.params.n)
    return bad_request("'best_of' different from 'n' is not supported.", "best_of", "unsupported_value");
  OSP_API_TRY(reject_unless(
      body, "suffix", [](const json& v) { return v.is_string() && v.get<std::string>().empty(); },
      "suffixes (insertion) are not supported."));

  const json* prompt = field(body, "prompt");
  if (!prompt) return bad_request("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter");
  auto empty_error = [] {
    return bad_request("Invalid 'prompt': the prompt is empty; give at least one token of input.", "prompt",
                       "empty_prompt");
  };
  if (prompt->is_string()) {
    r.prompts.push_back(PromptSpec{false, prompt->get<std::string>(), {}});
  } else if (prompt->is_array()) {
    if (prompt->empty()) return empty_error();
    const json& first = (*prompt)[0];
    if (first.is_string()) {
      for (const json& s : *prompt) {
        if (!s.is_string()) return type_error("prompt", "a string, an array of strings or token ids", *prompt);
        r.prompts.push_back(PromptSpec{false, s.get<std::string>(), {}});
      }
    } else if (first.is_number()) {
      PromptSpec ps{true, {}, {}};
      OSP_API_TRY(read_token_ids(*prompt, "prompt", limits, ps.token_ids));
      r.prompts.push_back(std::move(ps));
    } else if (first.is_array()) {
      for (const json& ids : *prompt) {
        PromptSpec ps{true, {}, {}};
        OSP_API_TRY(read_token_ids(ids, "prompt", limits, ps.token_ids));
        r.prompts.push_back(std::move(ps));
      }
    } else {
      return type_error("prompt", "a string, an array of strings or token ids", *prompt);
    }
  } else {
    return type_error("prompt", "a string, an array of strings or token ids", *prompt);
  }
  for (const PromptSpec& ps : r.prompts)
    if (ps.is_tokens ? ps.token_ids.empty() : ps.text.empty()) return empty_error();
  if (static_cast<int64_t>(r.prompts.size()) * r.params.n > limits.max_n)
    return bad_request("Too many choices: " + std::to_string(r.prompts.size()) + " prompts x n=" +
                           std::to_string(r.params.n) + " is more than " + std::to_string(limits.max_n) + ".",
                       "n", "invalid_value");
  return r;
}

ApiResult<TokenizeRequest> parse_tokenize_request(const json& body, const ParseLimits& limits) {
  TokenizeRequest r;
  OSP_API_TRY(check_known(body, {"model", "prompt", "messages", "tools", "add_generation_prompt", "add_special_tokens",
                                 "return_token_strs", "chat_template_kwargs", "continue_final_message"}));
  OSP_API_TRY(read_model(body, r.model, false));
  const bool has_prompt = field(body, "prompt") != nullptr;
  const bool has_messages = field(body, "messages") != nullptr;
  if (has_prompt == has_messages)
    return bad_request("Give exactly one of 'prompt' and 'messages'.", has_prompt ? "messages" : "prompt",
                       "invalid_value");
  if (has_prompt) {
    OSP_API_TRY(read_string(body, "prompt", r.prompt));
  } else {
    r.is_chat = true;
    r.add_special_tokens = false;
    OSP_API_TRY(read_messages(body, r.messages));
    bool tool_choice_none = false;
    OSP_API_TRY(read_tools(body, r.tools, tool_choice_none));
    OSP_API_TRY(read_bool(body, "add_generation_prompt", r.add_generation_prompt));
    if (const json* kw = field(body, "chat_template_kwargs")) {
      if (!kw->is_object()) return type_error("chat_template_kwargs", "an object", *kw);
      r.chat_template_kwargs = *kw;
    }
  }
  OSP_API_TRY(read_bool(body, "add_special_tokens", r.add_special_tokens));
  OSP_API_TRY(read_bool(body, "return_token_strs", r.return_token_strs));
  return r;
}

ApiResult<DetokenizeRequest> parse_detokenize_request(const json& body, const ParseLimits& limits) {
  DetokenizeRequest r;
  OSP_API_TRY(check_known(body, {"model", "tokens"}));
  OSP_API_TRY(read_model(body, r.model, false));
  const json* tokens = field(body, "tokens");
  if (!tokens) return bad_request("Missing required parameter: 'tokens'.", "tokens", "missing_required_parameter");
  OSP_API_TRY(read_token_ids(*tokens, "tokens", limits, r.tokens));
  return r;
}

}  // namespace osprey::server
