#include "core/json_nesting.h"

#include <gtest/gtest.h>

#include <string_view>

namespace osprey {
namespace {

int max_depth(std::string_view s) {
  JsonNesting n;
  int worst = 0;
  for (char c : s)
    if (n.feed(c) > 0 && n.depth() > worst) worst = n.depth();
  return worst;
}

TEST(JsonNesting, CountsBracketsOutsideStrings) {
  EXPECT_EQ(max_depth(R"({"a": [1, {"b": []}]})"), 4);
  EXPECT_EQ(max_depth(R"({"a": "[[[{{{"})"), 1);
  EXPECT_EQ(max_depth(R"(["\"[[", "\\", [[]]])"), 3);  // escaped quote, escaped backslash
  EXPECT_EQ(max_depth("plain text"), 0);
}

TEST(JsonNesting, ReportsOpenAndClose) {
  JsonNesting n;
  EXPECT_EQ(n.feed('{'), 1);
  EXPECT_EQ(n.feed('"'), 0);
  EXPECT_EQ(n.feed('}'), 0);  // inside a string
  EXPECT_EQ(n.feed('"'), 0);
  EXPECT_EQ(n.depth(), 1);
  EXPECT_EQ(n.feed('}'), -1);
  EXPECT_EQ(n.depth(), 0);
}

}  // namespace
}  // namespace osprey
