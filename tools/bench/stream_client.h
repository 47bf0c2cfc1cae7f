// StreamClient: an asynchronous HTTP/1.1 client (Boost.Asio/Beast) for
// benchmarking OpenAI-compatible streaming endpoints. A few I/O threads drive
// every request (one strand each, never a thread per stream). Each request:
// connect, POST the JSON body, read the SSE stream incrementally, timestamp
// every token chunk, take the token counts from the final usage chunk, and end
// with a RequestRecord that says how it went (ok, HTTP status, connect failure,
// timeout, disconnect mid-stream, malformed SSE). A per-request deadline
// closes the connection of a stalled request, so nothing waits forever.
// One connection per request ("Connection: close"): plain and robust; the
// server side holds the TIME_WAIT states. http:// only (no TLS).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "bench/metrics.h"
#include "osprey/status.h"

namespace osprey::bench {

// "http://host[:port][/prefix]" -> parts (prefix without a trailing '/').
struct BaseUrl {
  std::string host;
  std::string port = "80";
  std::string prefix;
};
Expected<BaseUrl> parse_base_url(const std::string& url);

struct ClientOptions {
  BaseUrl url;
  std::string path = "/v1/completions";  // appended to url.prefix
  std::string api_key;                   // non-empty: "Authorization: Bearer <key>"
  double timeout_s = 600;                // whole request, connect to last byte
  int num_io_threads = 1;
  size_t max_error_body_bytes = 4096;    // kept from a non-2xx response for the message
};

class StreamClient {
 public:
  using Clock = std::chrono::steady_clock;
  // Called once per request on an I/O thread. text: the generated text when
  // keep_text was set (multi-turn workloads), else empty.
  using Done = std::function<void(RequestRecord&& record, std::string&& text)>;

  // Resolves the host and starts the I/O threads.
  static Expected<std::unique_ptr<StreamClient>> create(const ClientOptions& options);
  ~StreamClient();  // stops the I/O threads; requests in flight are dropped without callbacks
  StreamClient(const StreamClient&) = delete;
  StreamClient& operator=(const StreamClient&) = delete;

  // Sends one streaming POST. record: prompt_tokens / expected_output_tokens
  // preset by the caller (used when the server reports no usage); the client
  // fills the timeline relative to origin().
  void send(std::string body, RequestRecord record, bool keep_text, Done done);
  // Runs fn on an I/O thread after delay_s seconds (>= 0).
  void post_after(double delay_s, std::function<void()> fn);
  // Seconds since the client was created (the timeline origin).
  double now() const;

  struct Impl;

 private:
  explicit StreamClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey::bench
