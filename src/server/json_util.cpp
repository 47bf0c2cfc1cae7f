#include "server/json_util.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "core/json_nesting.h"

namespace osprey::server {

int json_max_depth(std::string_view body, int limit) {
  JsonNesting nesting;
  int worst = 0;
  for (char c : body) {
    if (nesting.feed(c) > 0) {
      worst = std::max(worst, nesting.depth());
      if (worst > limit) return worst;
    }
  }
  return worst;
}

ApiResult<nlohmann::ordered_json> parse_json_object(std::string_view body) {
  if (body.empty()) return bad_request("The request body is empty; expected a JSON object.");
  if (json_max_depth(body, kMaxJsonDepth) > kMaxJsonDepth)
    return bad_request("The request body nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels.");
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(body);
  } catch (const nlohmann::ordered_json::exception& e) {
    const std::string why = e.what();
    if (why.find("UTF-8") != std::string::npos || why.find("surrogate") != std::string::npos)
      return bad_request("The request body is not valid UTF-8 JSON (" + why + ").");
    return bad_request("We could not parse the JSON body of your request (" + why +
                       "). The OpenAI API expects a JSON payload.");
  }
  if (!j.is_object()) return bad_request("The request body must be a JSON object.");
  return j;
}

std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

std::string random_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}() ^
                                   static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  static const char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  for (int w = 0; w < 2; ++w) {
    uint64_t r = rng();
    for (int k = 0; k < 12; ++k, r >>= 4) id.push_back(kHex[r & 15]);
  }
  return id;
}

int64_t unix_time_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace osprey::server
