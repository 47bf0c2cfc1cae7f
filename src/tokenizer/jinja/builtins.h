// Helpers shared by the builtin filters, tests, methods and globals.
#pragma once

#include <optional>
#include <string>

#include "tokenizer/jinja/interpreter.h"

namespace osprey::jinja {

// Argument i (positional) or `name` (keyword), else def.
Value arg_or(const CallArgs& a, size_t i, const char* name, Value def);
// Python int() of an int/bool value; fails for others.
int64_t to_int(const Value& v, const char* what);
// None / undefined -> nullopt, str -> value; fails for others.
std::optional<std::string> opt_string(const Value& v, const char* what);
std::string require_string(const Value& v, const char* what);
// Makes a str value after checking it against the size limit.
Value make_string(Interpreter& in, std::string s);
// A Python len(); fails for values without a length.
int64_t py_len(const Value& v);

}  // namespace osprey::jinja
