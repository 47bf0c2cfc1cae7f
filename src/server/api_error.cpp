#include "server/api_error.h"

namespace osprey::server {

nlohmann::ordered_json ApiError::to_json() const {
  nlohmann::ordered_json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return {{"error", std::move(e)}};
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code), 0};
}

ApiError not_found_error(std::string message, std::string param, std::string code) {
  return ApiError{404, std::move(message), "invalid_request_error", std::move(param), std::move(code), 0};
}

ApiError server_error(std::string message) {
  return ApiError{500, std::move(message), "server_error", "", "internal_error", 0};
}

ApiError unavailable_error(std::string message, int retry_after_s) {
  return ApiError{503, std::move(message), "server_error", "", "service_unavailable", retry_after_s};
}

ApiError api_error_from_status(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kCorrupt:
      return bad_request(status.message());
    case StatusCode::kUnsupported:
      return bad_request(status.message(), "", "unsupported");
    case StatusCode::kNotFound:
      return not_found_error(status.message());
    case StatusCode::kResourceExhausted:
      return ApiError{429, status.message(), "rate_limit_error", "", "queue_full", 1};
    case StatusCode::kUnavailable:
    case StatusCode::kCancelled:
      return unavailable_error(status.message());
    default:
      return server_error(status.message());
  }
}

}  // namespace osprey::server
