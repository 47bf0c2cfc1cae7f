// Renders the real chat templates in tests/templates/templates/ against the
// contexts in tests/templates/expected.json and compares byte for byte with
// the outputs transformers + jinja2 produced (tests/templates/make_expected.py).
#include <fstream>
#include <map>
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

const std::string kDir = std::string(OSPREY_SOURCE_DIR) + "/tests/templates/";

const std::map<std::string, std::string> kFiles = {
    {"smollm2", "smollm2.jinja"}, {"llama3", "llama3.jinja"},   {"llama3_1", "llama3_1.jinja"},
    {"qwen2_5", "qwen2_5.jinja"}, {"qwen3", "qwen3.jinja"},     {"mistral", "mistral.jinja"},
    {"gemma", "gemma.jinja"},
};

TEST(TemplateConformance, MatchesTransformersByteForByte) {
  std::string text = read_file(kDir + "expected.json");
  ASSERT_FALSE(text.empty()) << "missing " << kDir << "expected.json";
  auto records = nlohmann::ordered_json::parse(text);
  ASSERT_GT(records.size(), 100u);

  std::map<std::string, ChatTemplate> compiled;
  for (const auto& [name, file] : kFiles) {
    std::string src = read_file(kDir + "templates/" + file);
    ASSERT_FALSE(src.empty()) << file;
    auto t = ChatTemplate::compile(src);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status().message();
    compiled.emplace(name, std::move(t).value());
  }

  int num_outputs = 0, num_errors = 0;
  for (const auto& r : records) {
    const std::string name = r["template"].get<std::string>();
    const std::string where = name + "/" + r["case"].get<std::string>();
    auto it = compiled.find(name);
    ASSERT_NE(it, compiled.end()) << where;
    auto out = it->second.render(r["context"]);
    if (r.contains("error")) {
      EXPECT_FALSE(out.ok()) << where << ": reference raised " << r["error"] << " but we rendered:\n" << *out;
      ++num_errors;
    } else {
      ASSERT_TRUE(out.ok()) << where << ": " << out.status().message();
      EXPECT_EQ(*out, r["output"].get<std::string>()) << where;
      ++num_outputs;
    }
  }
  EXPECT_GT(num_outputs, 100);
  EXPECT_GT(num_errors, 10);
}

// The nlohmann::json (sorted keys) overload renders the same text where no
// output depends on key order.
TEST(TemplateConformance, SortedJsonOverloadForChatML) {
  auto t = ChatTemplate::compile(read_file(kDir + "templates/smollm2.jinja"));
  ASSERT_TRUE(t.ok());
  auto records = nlohmann::json::parse(read_file(kDir + "expected.json"));
  int checked = 0;
  for (const auto& r : records) {
    if (r["template"] != "smollm2" || r.contains("error")) continue;
    auto out = t->render(r["context"]);  // nlohmann::json: object keys sorted
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ(*out, r["output"].get<std::string>()) << r["case"];
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

}  // namespace
}  // namespace osprey
