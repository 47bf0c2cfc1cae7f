// Tool-call parsing of model output, for chat requests that carry `tools`.
// The model writes its calls as markup in its text; the parser splits the
// text into plain content and calls in the OpenAI shape (name, arguments as a
// JSON string). Formats:
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any
//                number of them, text around them is content (Qwen2.5, Qwen3,
//                Hermes, SmolLM3 templates)
//   llama3_json  {"name": ..., "parameters": {...}} as the whole output
//                (several separated by ';'), or after <|python_tag|>
//                (Llama 3.1 / 3.2 / 3.3)
//   mistral      [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]
//                (Mistral v0.3 and later in the JSON style)
// Malformed markup (bad JSON, no name, wrong types) is never an error: it
// stays in the content as the model wrote it. Never throws.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::server {

enum class ToolParserKind { kNone, kHermes, kLlama3Json, kMistral };

// "none", "hermes", "llama3_json", "mistral" ("auto" is resolved by the
// caller with detect_tool_parser); nullopt for anything else.
std::optional<ToolParserKind> tool_parser_from_name(std::string_view name);
const char* tool_parser_name(ToolParserKind kind);
// The parser a chat template's source calls for: its tool-call markup
// (<tool_call> -> hermes, [TOOL_CALLS] -> mistral, <|python_tag|> or an
// ipython environment -> llama3_json), else kNone.
ToolParserKind detect_tool_parser(std::string_view chat_template_source);
// The format's markers are special tokens, so the text must be decoded with
// skip_special_tokens = false for the parser to see them.
bool tool_parser_needs_special_tokens(ToolParserKind kind);

struct ToolCall {
  std::string id;         // "call_" + 24 hex digits
  std::string name;
  std::string arguments;  // JSON text of an object (or the string the model gave)
};

struct ToolParseResult {
  std::string content;          // text outside the calls; whitespace next to a call dropped
  std::vector<ToolCall> calls;  // in output order; empty: the text had no well-formed call
};

// Incremental parser over one sequence's text deltas. Content is released as
// soon as it cannot be the start of a call (a partial marker at the end is
// held back); a call is released once complete (hermes: its closing tag;
// llama3_json and mistral: the end of the output). Feeding the text in any
// split gives the same concatenated result as feeding it whole.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolParserKind kind) : kind_(kind) {}

  // What can be sent after this delta.
  ToolParseResult push(std::string_view delta);
  // End of the output: everything still held back.
  ToolParseResult finish();
  int num_calls() const { return num_calls_; }

 private:
  enum class Mode { kStart, kContent, kInCall };
  void run(ToolParseResult& out, bool at_end);
  void emit_content(ToolParseResult& out, std::string_view text);
  void emit_call(ToolParseResult& out, ToolCall call);

  ToolParserKind kind_;
  Mode mode_ = Mode::kStart;
  std::string pending_;   // text not yet released
  std::string held_ws_;   // trailing whitespace of released content, dropped if a call follows
  bool after_call_ = false;  // drop whitespace right after a call
  int num_calls_ = 0;
};

// The whole text at once (ToolCallStream over one delta).
ToolParseResult parse_tool_calls(ToolParserKind kind, std::string_view text);

}  // namespace osprey::server
