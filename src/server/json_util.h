// JSON helpers of the server: parsing request bodies without exceptions,
// dumping responses that may hold invalid UTF-8 (partial byte tokens), ids.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "server/api_error.h"

namespace osprey::server {

// Largest nesting depth of arrays/objects accepted in a request body.
inline constexpr int kMaxJsonDepth = 64;

// Maximum nesting depth of arrays/objects in `text` outside string literals;
// stops counting once past `limit`.
int json_max_depth(std::string_view text, int limit);

// Parses a request body that must be a JSON object. Errors (400) for
// malformed or truncated JSON, invalid UTF-8, lone surrogate escapes,
// nesting deeper than kMaxJsonDepth and non-object roots.
ApiResult<nlohmann::ordered_json> parse_json_object(std::string_view body);

// dump() that never throws: invalid UTF-8 becomes U+FFFD.
std::string dump_json(const nlohmann::ordered_json& j);

// True when `s` is well-formed UTF-8 (no surrogates, no overlongs).
bool is_valid_utf8(std::string_view s);

// A random id: prefix + 24 hex digits (e.g. "chatcmpl-3f1c...").
std::string random_id(std::string_view prefix);

// Seconds since the Unix epoch.
int64_t unix_time_s();

}  // namespace osprey::server
