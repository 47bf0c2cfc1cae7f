// The SSE parser with the input split at every byte boundary, and the
// OpenAI chunk reader.
#include "bench/sse_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace osprey::bench {
namespace {

std::vector<std::string> parse_in_pieces(const std::string& s, std::vector<size_t> cuts) {
  SseParser p;
  std::vector<std::string> out;
  size_t at = 0;
  cuts.push_back(s.size());
  for (size_t c : cuts) {
    EXPECT_TRUE(p.feed(std::string_view(s).substr(at, c - at), [&](std::string_view d) { out.emplace_back(d); }));
    at = c;
  }
  return out;
}

const std::string kStream =
    ": a comment\r\n"
    "data: {\"choices\":[{\"text\":\"h\\u00e9\"}]}\r\n\r\n"
    "event: ignored\n"
    "data:{\"a\":1}\n"
    "data: second line\n"
    "\n"
    "id: 7\rdata: cr only\r\r"
    "data: [DONE]\n\n"
    "data: unfinished";
const std::vector<std::string> kEvents = {"{\"choices\":[{\"text\":\"h\\u00e9\"}]}", "{\"a\":1}\nsecond line",
                                          "cr only", "[DONE]"};

TEST(SseParser, WholeInput) { EXPECT_EQ(parse_in_pieces(kStream, {}), kEvents); }

TEST(SseParser, SplitAtEveryByteBoundary) {
  for (size_t i = 0; i <= kStream.size(); ++i) EXPECT_EQ(parse_in_pieces(kStream, {i}), kEvents) << "cut at " << i;
  for (size_t i = 0; i <= kStream.size(); i += 3)
    for (size_t j = i; j <= kStream.size(); j += 5)
      EXPECT_EQ(parse_in_pieces(kStream, {i, j}), kEvents) << "cuts at " << i << ", " << j;
}

TEST(SseParser, ByteByByte) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < kStream.size(); ++i) cuts.push_back(i);
  EXPECT_EQ(parse_in_pieces(kStream, cuts), kEvents);
}

TEST(SseParser, PartialEventIsReported) {
  SseParser p;
  EXPECT_TRUE(p.feed("data: x\n", [](std::string_view) {}));
  EXPECT_TRUE(p.has_partial());
  EXPECT_TRUE(p.feed("\n", [](std::string_view) {}));
  EXPECT_FALSE(p.has_partial());
}

TEST(SseParser, OversizedEventFails) {
  SseParser p(16);
  int n = 0;
  EXPECT_FALSE(p.feed("data: " + std::string(100, 'x') + "\n\n", [&](std::string_view) { ++n; }));
  EXPECT_TRUE(p.failed());
  EXPECT_EQ(n, 0);
  EXPECT_FALSE(p.feed("data: y\n\n", [&](std::string_view) { ++n; }));
}

TEST(OpenAiChunk, CompletionChatUsageDoneErrorMalformed) {
  std::string text;
  auto c = parse_openai_chunk(R"({"choices":[{"index":0,"text":" hi","finish_reason":null}]})", &text);
  EXPECT_TRUE(c.has_token);
  EXPECT_FALSE(c.malformed);
  EXPECT_EQ(text, " hi");
  c = parse_openai_chunk(R"({"choices":[{"index":0,"delta":{"content":"yo"}}]})", &text);
  EXPECT_TRUE(c.has_token);
  EXPECT_EQ(text, " hiyo");
  c = parse_openai_chunk(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})", nullptr);
  EXPECT_FALSE(c.has_token);
  EXPECT_FALSE(c.malformed);
  c = parse_openai_chunk(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}})",
                         nullptr);
  EXPECT_TRUE(c.has_usage);
  EXPECT_EQ(c.prompt_tokens, 12);
  EXPECT_EQ(c.completion_tokens, 34);
  EXPECT_FALSE(c.has_token);
  EXPECT_TRUE(parse_openai_chunk("[DONE]", nullptr).done);
  EXPECT_TRUE(parse_openai_chunk("{\"choices\": [oops", nullptr).malformed);
  EXPECT_TRUE(parse_openai_chunk("42", nullptr).malformed);
  EXPECT_TRUE(parse_openai_chunk(R"({"choices":"x"})", nullptr).malformed);
  EXPECT_TRUE(parse_openai_chunk(R"({"id":"x"})", nullptr).malformed);
  c = parse_openai_chunk(R"({"error":{"message":"boom","type":"x"}})", nullptr);
  EXPECT_TRUE(c.error);
  EXPECT_EQ(c.error_message, "boom");
  // usage: null on ordinary chunks (vLLM with include_usage) is not usage.
  c = parse_openai_chunk(R"({"choices":[{"text":"a"}],"usage":null})", nullptr);
  EXPECT_TRUE(c.has_token);
  EXPECT_FALSE(c.has_usage);
}

}  // namespace
}  // namespace osprey::bench
