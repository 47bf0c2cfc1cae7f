// ApiError: an HTTP status plus the OpenAI error object
// {"error": {"message", "type", "param", "code"}} that the server answers with.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "osprey/status.h"

namespace osprey::server {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;      // "" -> null
  std::string code;       // "" -> null
  int retry_after_s = 0;  // > 0: sent as a Retry-After header

  nlohmann::ordered_json to_json() const;
};

ApiError bad_request(std::string message, std::string param = "", std::string code = "");
ApiError not_found_error(std::string message, std::string param = "", std::string code = "");
ApiError server_error(std::string message);
ApiError unavailable_error(std::string message, int retry_after_s = 1);
// Maps an engine Status (e.g. from Engine::submit) to the HTTP error it means.
ApiError api_error_from_status(const Status& status);

// Result of a parse or validation step: a value or the error to answer with.
template <class T>
struct ApiResult {
  std::optional<T> value;
  std::optional<ApiError> error;
  ApiResult(T v) : value(std::move(v)) {}         // NOLINT
  ApiResult(ApiError e) : error(std::move(e)) {}  // NOLINT
  bool ok() const { return value.has_value(); }
};

}  // namespace osprey::server
