// MockServer: a tiny OpenAI-compatible streaming server for measuring the
// bench client itself (how many streams and chunks per second it sustains)
// and for testing it against misbehaving servers. POST /v1/completions and
// /v1/chat/completions stream max_tokens one-word chunks as fast as possible
// (or token_delay_us apart), then a usage chunk and data: [DONE], chunked.
//
// The request's "model" picks a behaviour (for tests):
//   "fail-<status>"     answer <status> with an OpenAI error object
//   "disconnect-<k>"    stream k token chunks, then close the connection
//   "stall-<k>"         stream k token chunks, then send nothing more (until the client leaves)
//   "malformed"         one token chunk, then an event that is not JSON
//   "nousage"           no usage chunk (the client must count chunks)
//   "nodone"            end the response without data: [DONE]
//   "linger"            the whole stream and [DONE], then neither the end of the
//                       chunked body nor a close (until the client leaves)
//   anything else       the normal stream
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "osprey/status.h"

namespace osprey::bench {

struct MockServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                 // 0: an ephemeral port (see port())
  int num_io_threads = 1;
  int64_t token_delay_us = 0;   // between token chunks; 0: as fast as the socket takes them
  int default_max_tokens = 16;  // when the request has no max_tokens
};

struct MockServerCounters {
  int64_t requests = 0;
  int64_t chunks = 0;
};

class MockServer {
 public:
  explicit MockServer(MockServerOptions options);
  ~MockServer();  // stop()
  MockServer(const MockServer&) = delete;
  MockServer& operator=(const MockServer&) = delete;

  Status start();  // binds, listens, starts the I/O threads
  int port() const;
  void stop();     // closes everything, joins the threads; idempotent
  MockServerCounters counters() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace osprey::bench
