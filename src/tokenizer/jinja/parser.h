// Parser: tokens -> AST, following jinja2's grammar and operator precedence.
#pragma once

#include <memory>
#include <string_view>

#include "tokenizer/jinja/ast.h"

namespace osprey::jinja {

// Throws TemplateError with line/column on syntax errors. Nesting deeper
// than kMaxParseDepth is a syntax error (bounds the evaluator's recursion).
constexpr int kMaxParseDepth = 256;
std::unique_ptr<Template> parse_template(std::string_view source);

}  // namespace osprey::jinja
