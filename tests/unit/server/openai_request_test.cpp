#include "server/openai_request.h"

#include <gtest/gtest.h>

#include "server/json_util.h"

namespace osprey::server {
namespace {

using json = nlohmann::ordered_json;

ParseLimits limits() {
  ParseLimits l;
  l.vocab_size = 1000;
  return l;
}

json chat(json extra = json::object()) {
  json j = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return j;
}

json completion(json extra = json::object()) {
  json j = {{"model", "m"}, {"prompt", "hello"}};
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return j;
}

ApiError chat_error(json body) {
  auto r = parse_chat_request(body, limits());
  EXPECT_FALSE(r.ok()) << body.dump();
  return r.ok() ? ApiError{} : *r.error;
}

ApiError completion_error(json body) {
  auto r = parse_completion_request(body, limits());
  EXPECT_FALSE(r.ok()) << body.dump();
  return r.ok() ? ApiError{} : *r.error;
}

TEST(ChatRequest, DefaultsAndFields) {
  auto r = parse_chat_request(chat({{"temperature", 0.5},
                                    {"top_p", 0.9},
                                    {"n", 2},
                                    {"max_tokens", 7},
                                    {"stop", "END"},
                                    {"seed", -3},
                                    {"presence_penalty", 0.5},
                                    {"frequency_penalty", -0.5},
                                    {"logit_bias", {{"42", 5}}},
                                    {"logprobs", true},
                                    {"top_logprobs", 3},
                                    {"user", "u"},
                                    {"top_k", 40},
                                    {"min_p", 0.1},
                                    {"repetition_penalty", 1.1},
                                    {"min_tokens", 2},
                                    {"ignore_eos", true},
                                    {"skip_special_tokens", false},
                                    {"stream", true},
                                    {"stream_options", {{"include_usage", true}}}}),
                              limits());
  ASSERT_TRUE(r.ok()) << r.error->message;
  const GenerationRequest& g = *r.value;
  EXPECT_EQ(g.kind, ApiKind::kChat);
  EXPECT_EQ(g.model, "m");
  EXPECT_FLOAT_EQ(g.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(g.params.top_p, 0.9f);
  EXPECT_EQ(g.params.n, 2);
  EXPECT_EQ(g.params.max_tokens, 7);
  EXPECT_TRUE(g.max_tokens_given);
  ASSERT_EQ(g.params.stop.size(), 1u);
  EXPECT_EQ(g.params.stop[0], "END");
  ASSERT_TRUE(g.params.seed.has_value());
  EXPECT_EQ(*g.params.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_FLOAT_EQ(g.params.logit_bias.at(42), 5.0f);
  EXPECT_EQ(g.params.logprobs, 3);
  EXPECT_EQ(g.params.top_k, 40);
  EXPECT_FLOAT_EQ(g.params.min_p, 0.1f);
  EXPECT_EQ(g.params.min_tokens, 2);
  EXPECT_TRUE(g.params.ignore_eos);
  EXPECT_FALSE(g.params.skip_special_tokens);
  EXPECT_TRUE(g.stream);
  EXPECT_TRUE(g.include_usage);
  EXPECT_FALSE(g.add_special_tokens);
  EXPECT_EQ(g.user, "u");
}

TEST(ChatRequest, MaxCompletionTokensWinsAndDefaultsOff) {
  auto r = parse_chat_request(chat({{"max_tokens", 5}, {"max_completion_tokens", 9}}), limits());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value->params.max_tokens, 9);
  auto d = parse_chat_request(chat(), limits());
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d.value->max_tokens_given);
  EXPECT_EQ(d.value->params.logprobs, -1);
  EXPECT_FALSE(d.value->stream);
}

TEST(ChatRequest, NullMeansAbsent) {
  auto r = parse_chat_request(chat({{"temperature", nullptr}, {"stop", nullptr}, {"max_tokens", nullptr}}), limits());
  ASSERT_TRUE(r.ok());
  EXPECT_FLOAT_EQ(r.value->params.temperature, 1.0f);
  EXPECT_FALSE(r.value->max_tokens_given);
}

TEST(ChatRequest, ContentPartsAreJoined) {
  json body = chat();
  body["messages"] = {
      {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}};
  auto r = parse_chat_request(body, limits());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value->messages[0]["content"], "a\nb");
}

TEST(ChatRequest, Errors) {
  EXPECT_EQ(chat_error({{"messages", chat()["messages"]}}).param, "model");
  EXPECT_EQ(chat_error({{"model", "m"}}).param, "messages");
  EXPECT_EQ(chat_error({{"model", "m"}, {"messages", json::array()}}).param, "messages");
  EXPECT_EQ(chat_error({{"model", "m"}, {"messages", "hi"}}).param, "messages");
  EXPECT_EQ(chat_error({{"model", 3}, {"messages", chat()["messages"]}}).param, "model");
  EXPECT_EQ(chat_error({{"model", "m"}, {"messages", {{{"role", "wizard"}, {"content", "x"}}}}}).param,
            "messages[0].role");
  EXPECT_EQ(chat_error({{"model", "m"}, {"messages", {{{"content", "x"}}}}}).param, "messages[0].role");
  EXPECT_EQ(chat_error({{"model", "m"}, {"messages", {{{"role", "user"}}}}}).param, "messages[0].content");
  EXPECT_EQ(chat_error({{"model", "m"}, {"messages", {{{"role", "user"}, {"content", 5}}}}}).param,
            "messages[0].content");
  EXPECT_EQ(chat_error({{"model", "m"},
                        {"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}})
                .code,
            "unsupported_content_type");
  EXPECT_EQ(chat_error(chat({{"temperature", "hot"}})).param, "temperature");
  EXPECT_EQ(chat_error(chat({{"temperature", 2.5}})).param, "temperature");
  EXPECT_EQ(chat_error(chat({{"temperature", -1}})).param, "temperature");
  EXPECT_EQ(chat_error(chat({{"top_p", 1.5}})).param, "top_p");
  EXPECT_EQ(chat_error(chat({{"n", 0}})).param, "n");
  EXPECT_EQ(chat_error(chat({{"n", 100000}})).param, "n");
  EXPECT_EQ(chat_error(chat({{"n", 1.5}})).param, "n");
  EXPECT_EQ(chat_error(chat({{"max_tokens", 0}})).param, "max_tokens");
  EXPECT_EQ(chat_error(chat({{"max_tokens", -5}})).param, "max_tokens");
  EXPECT_EQ(chat_error(chat({{"max_tokens", 1e30}})).param, "max_tokens");
  EXPECT_EQ(chat_error(chat({{"max_tokens", "10"}})).param, "max_tokens");
  EXPECT_EQ(chat_error(chat({{"presence_penalty", 3}})).param, "presence_penalty");
  EXPECT_EQ(chat_error(chat({{"frequency_penalty", -3}})).param, "frequency_penalty");
  EXPECT_EQ(chat_error(chat({{"stop", 5}})).param, "stop");
  EXPECT_EQ(chat_error(chat({{"stop", {"a", 1}}})).param, "stop");
  EXPECT_EQ(chat_error(chat({{"stop", {""}}})).param, "stop");
  EXPECT_EQ(chat_error(chat({{"logit_bias", {{"abc", 1}}}})).param, "logit_bias");
  EXPECT_EQ(chat_error(chat({{"logit_bias", {{"5000", 1}}}})).param, "logit_bias");
  EXPECT_EQ(chat_error(chat({{"logit_bias", {{"5", 101}}}})).param, "logit_bias.5");
  EXPECT_EQ(chat_error(chat({{"logit_bias", 3}})).param, "logit_bias");
  EXPECT_EQ(chat_error(chat({{"logprobs", 1}})).param, "logprobs");
  EXPECT_EQ(chat_error(chat({{"top_logprobs", 3}})).param, "top_logprobs");
  EXPECT_EQ(chat_error(chat({{"logprobs", true}, {"top_logprobs", 21}})).param, "top_logprobs");
  EXPECT_EQ(chat_error(chat({{"stream_options", {{"include_usage", true}}}})).param, "stream_options");
  EXPECT_EQ(chat_error(chat({{"stream", true}, {"stream_options", {{"bogus", true}}}})).param, "bogus");
  EXPECT_EQ(chat_error(chat({{"stream", "yes"}})).param, "stream");
  EXPECT_EQ(chat_error(chat({{"frobnicate", 1}})).code, "unknown_parameter");
  EXPECT_EQ(chat_error(chat({{"echo", true}})).code, "unknown_parameter");
  EXPECT_EQ(chat_error(chat({{"response_format", {{"type", "json_object"}}}})).param, "response_format");
  EXPECT_EQ(chat_error(chat({{"tool_choice", "required"}})).param, "tool_choice");
  EXPECT_EQ(chat_error(chat({{"min_tokens", 10}, {"max_tokens", 5}})).param, "min_tokens");
  EXPECT_EQ(chat_error(chat({{"repetition_penalty", 0}})).param, "repetition_penalty");
  EXPECT_EQ(chat_error(chat({{"seed", 1.5}})).param, "seed");
  EXPECT_EQ(chat_error(chat({{"user", 7}})).param, "user");
}

TEST(ChatRequest, ErrorObjectShape) {
  ApiError e = chat_error(chat({{"temperature", 9}}));
  json j = e.to_json();
  ASSERT_TRUE(j.contains("error"));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_TRUE(j["error"]["message"].get<std::string>().find("2") != std::string::npos);
  EXPECT_TRUE(j["error"].contains("code"));
}

TEST(CompletionRequest, PromptForms) {
  auto s = parse_completion_request(completion(), limits());
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s.value->prompts.size(), 1u);
  EXPECT_EQ(s.value->prompts[0].text, "hello");
  EXPECT_EQ(s.value->params.max_tokens, 16);
  EXPECT_TRUE(s.value->add_special_tokens);

  auto strs = parse_completion_request(completion({{"prompt", {"a", "b", "c"}}}), limits());
  ASSERT_TRUE(strs.ok());
  EXPECT_EQ(strs.value->prompts.size(), 3u);

  auto ids = parse_completion_request(completion({{"prompt", {1, 2, 3}}}), limits());
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids.value->prompts.size(), 1u);
  EXPECT_TRUE(ids.value->prompts[0].is_tokens);
  EXPECT_EQ(ids.value->prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));

  auto nested = parse_completion_request(completion({{"prompt", {{1, 2}, {3}}}}), limits());
  ASSERT_TRUE(nested.ok());
  ASSERT_EQ(nested.value->prompts.size(), 2u);
  EXPECT_EQ(nested.value->prompts[1].token_ids, (std::vector<int32_t>{3}));
}

TEST(CompletionRequest, LogprobsEchoBestOf) {
  auto r = parse_completion_request(completion({{"logprobs", 2}, {"echo", true}, {"best_of", 1}}), limits());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value->params.logprobs, 2);
  EXPECT_EQ(r.value->params.prompt_logprobs, 2);
  EXPECT_TRUE(r.value->echo);
  auto z = parse_completion_request(completion({{"logprobs", 0}}), limits());
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z.value->params.logprobs, 0);
  EXPECT_TRUE(z.value->logprobs);
}

TEST(CompletionRequest, Errors) {
  EXPECT_EQ(completion_error({{"model", "m"}}).param, "prompt");
  EXPECT_EQ(completion_error(completion({{"prompt", ""}})).code, "empty_prompt");
  EXPECT_EQ(completion_error(completion({{"prompt", json::array()}})).code, "empty_prompt");
  EXPECT_EQ(completion_error(completion({{"prompt", {json::array()}}})).code, "empty_prompt");
  EXPECT_EQ(completion_error(completion({{"prompt", 5}})).param, "prompt");
  EXPECT_EQ(completion_error(completion({{"prompt", {"a", 1}}})).param, "prompt");
  EXPECT_EQ(completion_error(completion({{"prompt", {1, 5000}}})).param, "prompt");
  EXPECT_EQ(completion_error(completion({{"prompt", {1, -1}}})).param, "prompt");
  EXPECT_EQ(completion_error(completion({{"prompt", {1, 2.5}}})).param, "prompt");
  EXPECT_EQ(completion_error(completion({{"logprobs", true}})).param, "logprobs");
  EXPECT_EQ(completion_error(completion({{"logprobs", 50}})).param, "logprobs");
  EXPECT_EQ(completion_error(completion({{"best_of", 3}})).param, "best_of");
  EXPECT_EQ(completion_error(completion({{"suffix", "x"}})).param, "suffix");
  EXPECT_EQ(completion_error(completion({{"messages", json::array()}})).code, "unknown_parameter");
  EXPECT_EQ(completion_error(completion({{"echo", 1}})).param, "echo");
  EXPECT_EQ(completion_error(completion({{"prompt", {"a", "b"}}, {"n", 100}})).param, "n");
}

TEST(TokenizeRequest, Shapes) {
  auto p = parse_tokenize_request({{"prompt", "hi"}}, limits());
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p.value->is_chat);
  EXPECT_TRUE(p.value->add_special_tokens);
  auto c = parse_tokenize_request({{"model", "m"}, {"messages", chat()["messages"]}}, limits());
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c.value->is_chat);
  EXPECT_FALSE(c.value->add_special_tokens);
  EXPECT_FALSE(parse_tokenize_request({{"model", "m"}}, limits()).ok());
  EXPECT_FALSE(parse_tokenize_request({{"prompt", "a"}, {"messages", chat()["messages"]}}, limits()).ok());
  EXPECT_FALSE(parse_tokenize_request({{"prompt", 3}}, limits()).ok());
  auto d = parse_detokenize_request({{"tokens", {1, 2}}}, limits());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value->tokens.size(), 2u);
  EXPECT_FALSE(parse_detokenize_request({{"tokens", {1, 99999}}}, limits()).ok());
  EXPECT_FALSE(parse_detokenize_request({{"tokens", "12"}}, limits()).ok());
  EXPECT_FALSE(parse_detokenize_request(json::object(), limits()).ok());
}

TEST(JsonBody, RejectsMalformedInput) {
  EXPECT_FALSE(parse_json_object("").ok());
  EXPECT_FALSE(parse_json_object("{").ok());
  EXPECT_FALSE(parse_json_object("{\"model\": \"m\",").ok());
  EXPECT_FALSE(parse_json_object("[1,2]").ok());
  EXPECT_FALSE(parse_json_object("null").ok());
  EXPECT_FALSE(parse_json_object("{\"a\": 1} trailing").ok());
  EXPECT_FALSE(parse_json_object("{\"a\": \"\\ud800\"}").ok());   // lone high surrogate
  EXPECT_FALSE(parse_json_object("{\"a\": \"\\udc00x\"}").ok());  // lone low surrogate
  EXPECT_FALSE(parse_json_object("{\"a\": \"\xff\xfe\"}").ok());  // invalid UTF-8
  EXPECT_FALSE(parse_json_object("{\"a\": \"\xc0\xaf\"}").ok());  // overlong
  EXPECT_FALSE(parse_json_object(std::string(100, '[') + std::string(100, ']')).ok());
  auto ok = parse_json_object("{\"a\": \"\\ud83d\\ude00 caf\xc3\xa9\"}");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok.value)["a"], "\xf0\x9f\x98\x80 caf\xc3\xa9");
  auto bad = parse_json_object("{\"a\": \"\\ud800\"}");
  EXPECT_EQ(bad.error->http_status, 400);
}

TEST(JsonUtil, Utf8AndIds) {
  EXPECT_TRUE(is_valid_utf8("abc \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));      // encoded surrogate
  EXPECT_FALSE(is_valid_utf8("\xe2\x82"));          // truncated
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_EQ(dump_json(nlohmann::ordered_json("\xff")), "\"\xef\xbf\xbd\"");
  const std::string a = random_id("chatcmpl-"), b = random_id("chatcmpl-");
  EXPECT_EQ(a.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(a.size(), 9u + 24u);
  EXPECT_NE(a, b);
}


TEST(ChatRequest, ToolCallHistoryArgumentsBecomeObjects) {
  json messages = json::parse(R"([
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Paris\", \"a\": 1}"}},
      {"id": "call_2", "type": "function", "function": {"name": "x", "arguments": "not json"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}])");
  auto r = parse_chat_request(chat({{"messages", messages}, {"tool_choice", "none"}}), limits());
  ASSERT_TRUE(r.ok()) << r.error->message;
  const json& args = r.value->messages[1]["tool_calls"][0]["function"]["arguments"];
  ASSERT_TRUE(args.is_object());
  EXPECT_EQ(args.dump(), "{\"city\":\"Paris\",\"a\":1}");  // the client's key order
  EXPECT_EQ(r.value->messages[1]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_TRUE(r.value->tool_choice_none);

  for (const char* bad : {R"([{"role": "user", "content": "x", "tool_calls": []}])",
                          R"([{"role": "assistant", "tool_calls": {}}])",
                          R"([{"role": "assistant", "tool_calls": [3]}])",
                          R"([{"role": "assistant", "tool_calls": [{"type": "function"}]}])",
                          R"([{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}])",
                          R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}])"}) {
    ApiError e = chat_error(chat({{"messages", json::parse(bad)}}));
    EXPECT_EQ(e.http_status, 400) << bad;
    EXPECT_EQ(e.param.rfind("messages[0]", 0), 0u) << bad << " " << e.param;
  }
}

TEST(ChatRequest, ToolChoiceAndSkipSpecialFlags) {
  auto r = parse_chat_request(chat({{"tool_choice", "auto"}}), limits());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r.value->tool_choice_none);
  EXPECT_FALSE(r.value->skip_special_tokens_given);
  r = parse_chat_request(chat({{"skip_special_tokens", true}}), limits());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.value->skip_special_tokens_given);
  ApiError e = chat_error(chat({{"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}}));
  EXPECT_NE(e.message.find("constrained decoding"), std::string::npos) << e.message;
}
}  // namespace
}  // namespace osprey::server
