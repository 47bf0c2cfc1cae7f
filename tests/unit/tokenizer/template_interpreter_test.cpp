// Interpreter tests: one-construct snippets compared with jinja2's output
// (tests/templates/snippets_expected.json, from make_expected.py), syntax
// error positions, and sandbox limits.
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"

namespace osprey {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Expected<std::string> render(std::string_view src, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object(),
                             const TemplateLimits& limits = {}) {
  auto t = ChatTemplate::compile(src);
  if (!t.ok()) return t.status();
  return t->render(ctx, limits);
}

TEST(TemplateInterpreter, SnippetsMatchJinja2) {
  auto text = read_file(std::string(OSPREY_SOURCE_DIR) + "/tests/templates/snippets_expected.json");
  ASSERT_FALSE(text.empty());
  auto snippets = nlohmann::ordered_json::parse(text);
  ASSERT_GT(snippets.size(), 50u);
  for (const auto& sn : snippets) {
    const std::string name = sn["name"].get<std::string>();
    auto out = render(sn["template"].get<std::string>(), sn["context"]);
    if (sn.contains("error")) {
      EXPECT_FALSE(out.ok()) << name << ": jinja2 raised " << sn["error"] << " but we rendered " << *out;
    } else {
      ASSERT_TRUE(out.ok()) << name << ": " << out.status().message();
      EXPECT_EQ(*out, sn["output"].get<std::string>()) << name;
    }
  }
}

TEST(TemplateInterpreter, SyntaxErrorsNameLineAndColumn) {
  struct Case {
    const char* src;
    const char* where;
  };
  const Case cases[] = {
      {"ok\n{% if x %}\nno end", "line 3"},
      {"{{ 1 + }}", "line 1, column 8"},
      {"a\nb {% for x in %}{% endfor %}", "line 2"},
      {"{% endfor %}", "line 1"},
      {"{{ 'unterminated }}", "line 1, column 4"},
      {"x\n  {% frobnicate %}", "line 2"},
      {"{# never closed", "line 1, column 1"},
      {"{{ (1 }}", "line 1"},
      {"{{ 99999999999999999999 }}", "line 1, column 4"},
  };
  for (const auto& c : cases) {
    auto t = ChatTemplate::compile(c.src);
    ASSERT_FALSE(t.ok()) << c.src;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.where), std::string::npos) << c.src << " -> " << t.status().message();
  }
}

TEST(TemplateInterpreter, RuntimeErrorsCarryPosition) {
  auto out = render("line one\n  {{ raise_exception('custom failure') }}");
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("custom failure"), std::string::npos);
  EXPECT_NE(out.status().message().find("line 2"), std::string::npos) << out.status().message();
  auto undef = render("{{ a.b }}");
  ASSERT_FALSE(undef.ok());
  EXPECT_NE(undef.status().message().find("'a' is undefined"), std::string::npos);
}

TEST(TemplateInterpreter, HugeRangeIsRefused) {
  auto out = render("{% for i in range(10**9) %}x{% endfor %}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
}

TEST(TemplateInterpreter, LoopIterationLimit) {
  TemplateLimits limits;
  limits.max_loop_iterations = 1000;
  auto out = render("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", nlohmann::ordered_json::object(), limits);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(render("{% for i in range(30) %}{% for j in range(30) %}{% endfor %}{% endfor %}", nlohmann::ordered_json::object(), limits).ok());
}

TEST(TemplateInterpreter, DeepMacroRecursionIsBounded) {
  auto out = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(out.status().message().find("recursion"), std::string::npos);
}

TEST(TemplateInterpreter, OutputBombsAreBounded) {
  TemplateLimits limits;
  limits.max_output_bytes = 1 << 16;
  const char* bombs[] = {
      "{{ 'a' * 1000000 }}",
      "{% set ns = namespace(s='aaaaaaaaaa') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
      "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
      "{% for i in range(100000) %}0123456789{% endfor %}",
      "{{ ('x' * 60000)|replace('x', 'xxxxxxxx') }}",
      "{% set ns = namespace(l=[1, 2]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
      "{{ [[1] * 1000] * 100000000 }}",
  };
  for (const char* b : bombs) {
    auto out = render(b, nlohmann::ordered_json::object(), limits);
    ASSERT_FALSE(out.ok()) << b;
    EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted) << b << ": " << out.status().message();
  }
}

TEST(TemplateInterpreter, StepLimitStopsLongRenders) {
  TemplateLimits limits;
  limits.max_steps = 10000;
  auto out = render("{% for i in range(100000) %}{% endfor %}", nlohmann::ordered_json::object(), limits);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
}

TEST(TemplateInterpreter, DeepNestingIsASyntaxErrorNotACrash) {
  std::string deep = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  auto t = ChatTemplate::compile(deep);
  ASSERT_FALSE(t.ok());
  std::string nested_ifs;
  for (int i = 0; i < 5000; ++i) nested_ifs += "{% if true %}";
  EXPECT_FALSE(ChatTemplate::compile(nested_ifs).ok());
  std::string nots = "{{ " + [] { std::string s; for (int i = 0; i < 100000; ++i) s += "not "; return s; }() + "1 }}";
  EXPECT_FALSE(ChatTemplate::compile(nots).ok());
}

TEST(TemplateInterpreter, ContextMustBeAnObject) {
  auto t = ChatTemplate::compile("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->render(nlohmann::json::array()).ok());
}

TEST(TemplateInterpreter, CopiesShareTheCompiledTemplate) {
  auto t = ChatTemplate::compile("{{ a }}");
  ASSERT_TRUE(t.ok());
  ChatTemplate copy = *t;
  EXPECT_EQ(&copy.source(), &t->source());
  auto out = copy.render(nlohmann::json{{"a", 5}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "5");
}

}  // namespace
}  // namespace osprey
