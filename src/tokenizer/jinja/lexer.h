// Lexer: template source -> tokens, with Jinja2's whitespace rules as
// transformers configures them (trim_blocks, lstrip_blocks,
// keep_trailing_newline=False, newlines normalised to "\n").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace osprey::jinja {

enum class TokKind {
  kText,        // template data (also the contents of raw blocks)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,      // text holds the decoded literal
  kInt,
  kFloat,
  kOp,          // text holds the operator
  kEof,
};

struct Token {
  TokKind kind = TokKind::kEof;
  std::string text;
  int line = 1;
  int column = 1;
};

// Throws TemplateError (with line/column) on lexical errors.
std::vector<Token> tokenize(std::string_view source);

}  // namespace osprey::jinja
