// HttpServer: asynchronous HTTP/1.1 over Boost.Beast/Asio. A few I/O threads
// serve every connection (one strand each, never a thread per connection);
// handlers run on a small worker pool so that tokenizing and templating never
// stall I/O. Keep-alive, pipelining, a body size limit (413), a deadline for
// a whole request to arrive (408, slow clients), an idle keep-alive timeout, a
// write timeout, optional CORS, and an X-Request-Id on every response.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "osprey/status.h"
#include "server/http_types.h"

namespace osprey::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: an ephemeral port (see HttpServer::port())
  int num_io_threads = 2;
  int num_worker_threads = 2;
  size_t max_body_bytes = size_t{8} << 20;
  size_t max_header_bytes = size_t{64} << 10;
  std::chrono::milliseconds request_timeout{30000};     // first byte -> whole request read
  std::chrono::milliseconds keep_alive_timeout{60000};  // idle between requests
  std::chrono::milliseconds write_timeout{60000};       // one write making no progress
  // Origins allowed by CORS ("*" for any); empty: no CORS headers.
  std::vector<std::string> cors_origins;
  // Called (on an I/O thread) with the status of every error the transport
  // answers itself (400, 408, 413, 431), e.g. to count it in the metrics.
  std::function<void(int status)> on_transport_error;
};

struct HttpServerCounters {
  int64_t open_connections = 0;
  int64_t accepted_connections = 0;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens, starts the I/O and worker threads.
  Status start();
  int port() const;
  // Stops accepting, answers later requests with "Connection: close" and
  // closes idle keep-alive connections; in-flight responses continue.
  void begin_drain();
  // Closes every connection and joins the threads. Idempotent.
  void stop();
  HttpServerCounters counters() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace osprey::server
