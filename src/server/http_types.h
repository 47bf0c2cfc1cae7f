// The transport's view of one HTTP exchange, independent of Boost: the parsed
// request, a whole response, and the ResponseWriter a handler answers through
// (whole, or streamed as chunked transfer encoding, e.g. SSE).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace osprey::server {

struct HttpRequest {
  std::string method;                                        // "GET", "POST", ...
  std::string path;                                          // target without the query
  std::string query;                                         // after '?', may be empty
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  std::string request_id;  // from X-Request-Id when sane, else generated
  std::string remote;      // "ip:port"

  // The first header of that (lower-case) name, or "".
  std::string_view header(std::string_view lower_name) const {
    for (const auto& [k, v] : headers)
      if (k == lower_name) return v;
    return {};
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

// Answers one request. Thread-safe; every call posts onto the connection's
// strand, so the handler may answer from any thread, now or later. Calls
// after the connection closed are ignored. Exactly one of send() or
// start_stream() ... finish() must be made.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  virtual void send(HttpResponse response) = 0;
  // Starts a chunked response (headers only); then write() chunks, finish().
  virtual void start_stream(int status, std::string content_type,
                            std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  virtual void write(std::string data) = 0;
  virtual void finish() = 0;
  // fn runs once, on an I/O thread, if the client goes away (or the write
  // times out) before the response is complete; immediately when it already has.
  virtual void on_disconnect(std::function<void()> fn) = 0;
  virtual bool disconnected() const = 0;
  virtual const std::string& request_id() const = 0;
};

using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<ResponseWriter>)>;

// "OK", "Not Found", ...
const char* http_reason(int status);

}  // namespace osprey::server
