// Tool-call parsers: hermes, llama3_json, mistral; streaming == whole for
// every split; malformed markup stays content; random input never crashes.
#include "server/tool_parser.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

namespace osprey::server {
namespace {

ToolParseResult stream_in_pieces(ToolParserKind kind, std::string_view text, const std::vector<size_t>& cuts) {
  ToolCallStream s(kind);
  ToolParseResult all;
  size_t prev = 0;
  auto add = [&](ToolParseResult r) {
    all.content += r.content;
    for (auto& c : r.calls) all.calls.push_back(std::move(c));
  };
  for (size_t c : cuts) {
    add(s.push(text.substr(prev, c - prev)));
    prev = c;
  }
  add(s.push(text.substr(prev)));
  add(s.finish());
  return all;
}

void expect_same(const ToolParseResult& a, const ToolParseResult& b, const std::string& what) {
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << what;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << what;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << what;
  }
}

// Whole, one character at a time, and random splits all agree.
ToolParseResult parse_every_way(ToolParserKind kind, const std::string& text) {
  ToolParseResult whole = parse_tool_calls(kind, text);
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  expect_same(whole, stream_in_pieces(kind, text, every), "char by char: " + text);
  std::mt19937 rng(static_cast<uint32_t>(text.size()));
  for (int trial = 0; trial < 5 && text.size() > 2; ++trial) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i)
      if (rng() % 4 == 0) cuts.push_back(i);
    expect_same(whole, stream_in_pieces(kind, text, cuts), "random split: " + text);
  }
  for (const ToolCall& c : whole.calls) {
    EXPECT_EQ(c.id.rfind("call_", 0), 0u) << c.id;
    EXPECT_EQ(c.id.size(), 5u + 24u) << c.id;
  }
  return whole;
}

TEST(ToolParser, Names) {
  EXPECT_EQ(tool_parser_from_name("hermes"), ToolParserKind::kHermes);
  EXPECT_EQ(tool_parser_from_name("llama3_json"), ToolParserKind::kLlama3Json);
  EXPECT_EQ(tool_parser_from_name("mistral"), ToolParserKind::kMistral);
  EXPECT_EQ(tool_parser_from_name("none"), ToolParserKind::kNone);
  EXPECT_FALSE(tool_parser_from_name("auto").has_value());
  EXPECT_FALSE(tool_parser_from_name("Hermes").has_value());
  for (auto k : {ToolParserKind::kNone, ToolParserKind::kHermes, ToolParserKind::kLlama3Json, ToolParserKind::kMistral})
    EXPECT_EQ(tool_parser_from_name(tool_parser_name(k)), k);
}

std::string read_template(const std::string& name) {
  std::ifstream f(std::string(OSPREY_SOURCE_DIR) + "/tests/templates/templates/" + name);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(ToolParser, DetectsFromTheRealTemplates) {
  EXPECT_EQ(detect_tool_parser(read_template("qwen2_5.jinja")), ToolParserKind::kHermes);
  EXPECT_EQ(detect_tool_parser(read_template("qwen3.jinja")), ToolParserKind::kHermes);
  EXPECT_EQ(detect_tool_parser(read_template("llama3_1.jinja")), ToolParserKind::kLlama3Json);
  const std::string smol = read_template("smollm2.jinja");
  ASSERT_FALSE(smol.empty());
  EXPECT_EQ(detect_tool_parser(smol), ToolParserKind::kNone);
  EXPECT_EQ(detect_tool_parser(read_template("llama3.jinja")), ToolParserKind::kNone);
  EXPECT_EQ(detect_tool_parser(read_template("mistral.jinja")), ToolParserKind::kNone);  // v0.1: no tools
  EXPECT_EQ(detect_tool_parser("{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' }}"), ToolParserKind::kMistral);
  EXPECT_EQ(detect_tool_parser(""), ToolParserKind::kNone);
}

TEST(ToolParser, HermesOneCall) {
  auto r = parse_every_way(ToolParserKind::kHermes,
                           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                           "\"unit\": \"c\"}}\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Paris\",\"unit\":\"c\"}");  // the model's key order
  EXPECT_EQ(r.content, "");
}

TEST(ToolParser, HermesContentAroundAndSeveralCalls) {
  auto r = parse_every_way(ToolParserKind::kHermes,
                           "Let me check.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n"
                           "<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": [1, 2, {\"y\": \"}\"}]}}</tool_call>\n"
                           "Done.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].arguments, "{\"x\":[1,2,{\"y\":\"}\"}]}");
  EXPECT_EQ(r.content, "Let me check.Done.");
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
}

TEST(ToolParser, HermesUnclosedAtEndStillACall) {
  auto r = parse_every_way(ToolParserKind::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\":1}");
}

TEST(ToolParser, HermesArgumentsVariants) {
  auto r = parse_every_way(ToolParserKind::kHermes,
                           "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"
                           "<tool_call>{\"name\": \"g\"}</tool_call>"
                           "<tool_call>{\"name\": \"h\", \"parameters\": {\"b\": true}}</tool_call>");
  ASSERT_EQ(r.calls.size(), 3u);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": 1}");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_EQ(r.calls[2].arguments, "{\"b\":true}");
}

TEST(ToolParser, HermesMalformedStaysContent) {
  const std::vector<std::string> bad = {
      "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",    // truncated JSON
      "<tool_call>{\"arguments\": {}}</tool_call>",                  // no name
      "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",     // name not a string
      "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",  // empty name
      "<tool_call>{\"name\": \"f\", \"arguments\": 7}</tool_call>",  // arguments not an object
      "<tool_call>[1, 2]</tool_call>",                               // not an object
      "<tool_call>{\"name\": \"f\"} trailing</tool_call>",           // text after the JSON
      "<tool_call>not json at all",                                  // unclosed, not JSON
      "<tool_call></tool_call>",                                     // empty
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"\xff\"}}</tool_call>",  // invalid UTF-8
  };
  for (const std::string& text : bad) {
    auto r = parse_every_way(ToolParserKind::kHermes, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text) << text;
  }
  // A malformed call next to a good one: the good one is parsed, the bad one kept as text.
  auto r = parse_every_way(ToolParserKind::kHermes,
                           "<tool_call>{oops}</tool_call><tool_call>{\"name\": \"ok\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "ok");
  EXPECT_EQ(r.content, "<tool_call>{oops}</tool_call>");
}

TEST(ToolParser, HermesPartialMarkerIsHeldThenReleased) {
  ToolCallStream s(ToolParserKind::kHermes);
  EXPECT_EQ(s.push("Hello <tool_").content, "Hello");  // the space may precede a call: held
  ToolParseResult r = s.push("cat> is not a tag");
  EXPECT_EQ(r.content, " <tool_cat> is not a tag");
  EXPECT_EQ(s.finish().content, "");
  EXPECT_EQ(s.num_calls(), 0);
}

TEST(ToolParser, HermesStreamReleasesACallAtItsClosingTag) {
  ToolCallStream s(ToolParserKind::kHermes);
  EXPECT_TRUE(s.push("<tool_call>{\"name\": \"f\", ").calls.empty());
  ToolParseResult r = s.push("\"arguments\": {}}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
  EXPECT_EQ(s.num_calls(), 1);
}

TEST(ToolParser, PlainTextUntouched) {
  for (auto k : {ToolParserKind::kNone, ToolParserKind::kHermes, ToolParserKind::kLlama3Json, ToolParserKind::kMistral}) {
    auto r = parse_every_way(k, "  The answer is 42.\n\nNothing to call here.  ");
    EXPECT_TRUE(r.calls.empty());
    EXPECT_EQ(r.content, "  The answer is 42.\n\nNothing to call here.  ");
    EXPECT_EQ(parse_every_way(k, "").content, "");
  }
  // kNone leaves markup alone.
  auto r = parse_every_way(ToolParserKind::kNone, "<tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_TRUE(r.calls.empty());
}

TEST(ToolParser, Llama3Json) {
  auto r = parse_every_way(ToolParserKind::kLlama3Json,
                           "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Oslo\"}");
  EXPECT_EQ(r.content, "");

  r = parse_every_way(ToolParserKind::kLlama3Json,
                      "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": 1}}");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].arguments, "{\"k\":1}");

  r = parse_every_way(ToolParserKind::kLlama3Json, "Sure.<|python_tag|>{\"name\": \"a\", \"parameters\": {}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "Sure.");
}

TEST(ToolParser, Llama3JsonMalformedStaysContent) {
  const std::vector<std::string> bad = {
      "{\"answer\": 42}",                                       // JSON but not a call
      "{\"name\": \"a\", \"parameters\": {}} and some text",   // text after
      "{\"name\": \"a\", \"parameters\": {}};",                 // dangling separator... is fine? no: empty call
      "{\"name\": \"a\", \"parameters\": {",                     // truncated
      "<|python_tag|>print('hi')",                              // code, not JSON
      "{",
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    auto r = parse_every_way(ToolParserKind::kLlama3Json, bad[i]);
    if (i == 2) continue;  // a trailing ';' with nothing after is accepted below
    EXPECT_TRUE(r.calls.empty()) << bad[i];
    EXPECT_EQ(r.content, bad[i]) << bad[i];
  }
  auto r = parse_every_way(ToolParserKind::kLlama3Json, bad[2]);
  EXPECT_EQ(r.calls.size(), 1u);
}

TEST(ToolParser, Mistral) {
  auto r = parse_every_way(ToolParserKind::kMistral,
                           "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, "
                           "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Rome\"}");
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.content, "");

  r = parse_every_way(ToolParserKind::kMistral, "I will call it.[TOOL_CALLS]{\"name\": \"f\", \"arguments\": {}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "I will call it.");

  for (const std::string bad : {"[TOOL_CALLS] []", "[TOOL_CALLS] [{\"name\": \"f\"}, 3]", "[TOOL_CALLS] oops",
                                "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}"}) {
    auto m = parse_every_way(ToolParserKind::kMistral, bad);
    EXPECT_TRUE(m.calls.empty()) << bad;
    EXPECT_EQ(m.content, bad) << bad;
  }
}

TEST(ToolParser, DeepNestingIsRefusedNotACrash) {
  std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ";
  for (int i = 0; i < 100000; ++i) deep += "[";
  deep += "</tool_call>";
  auto r = parse_tool_calls(ToolParserKind::kHermes, deep);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, deep);
  std::string deep2 = "[TOOL_CALLS] ";
  for (int i = 0; i < 100000; ++i) deep2 += "[";
  for (int i = 0; i < 100000; ++i) deep2 += "]";
  EXPECT_TRUE(parse_tool_calls(ToolParserKind::kMistral, deep2).calls.empty());
}

TEST(ToolParser, RandomInputNeverCrashesAndStreamingAgrees) {
  // Fragments of every format, shuffled: each parse must neither crash nor
  // lose text (no call: content == input), and splits must agree.
  const std::vector<std::string> pieces = {"<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "{", "}",
                                           "[", "]", "\"name\"", ": ", "\"f\"", ", ", "\"arguments\"", "\"parameters\"",
                                           ";", " ", "\n", "text", "\\", "\"", "<tool", "_call>", "\xff", "1"};
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 400; ++iter) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    for (auto k : {ToolParserKind::kHermes, ToolParserKind::kLlama3Json, ToolParserKind::kMistral}) {
      auto r = parse_every_way(k, text);
      if (r.calls.empty()) {
        EXPECT_EQ(r.content, text) << text;
      }
    }
  }
}

}  // namespace
}  // namespace osprey::server
