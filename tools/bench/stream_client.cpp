#include "bench/stream_client.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <limits>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "bench/sse_parser.h"

namespace osprey::bench {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

Expected<BaseUrl> parse_base_url(const std::string& url) {
  std::string rest = url;
  const std::string scheme = "http://";
  if (rest.rfind("https://", 0) == 0) return unsupported("https is not supported (use http://)");
  if (rest.rfind(scheme, 0) == 0) rest = rest.substr(scheme.size());
  if (rest.empty()) return invalid_argument("empty base URL");
  BaseUrl u;
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) u.prefix = rest.substr(slash);
  while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  if (!authority.empty() && authority.front() == '[') {  // [v6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) return invalid_argument("bad IPv6 host in " + url);
    u.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return invalid_argument("bad base URL " + url);
      u.port = authority.substr(close + 2);
    }
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) u.port = authority.substr(colon + 1);
  }
  if (u.host.empty()) return invalid_argument("no host in base URL " + url);
  if (u.port.empty() || u.port.size() > 5) return invalid_argument("bad port in base URL " + url);
  for (char c : u.port)
    if (!std::isdigit(static_cast<unsigned char>(c))) return invalid_argument("bad port in base URL " + url);
  return u;
}

struct StreamClient::Impl {
  ClientOptions options;
  std::string target;       // prefix + path
  std::string host_header;  // host[:port]
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  tcp::resolver::results_type endpoints;
  Clock::time_point origin = Clock::now();

  double since_origin() const { return std::chrono::duration<double>(Clock::now() - origin).count(); }
};

namespace {

// One request's connection and stream; lives in its handlers (shared_from_this).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(StreamClient::Impl& client, std::string body, RequestRecord record, bool keep_text, StreamClient::Done done)
      : client_(client),
        socket_(asio::make_strand(client.ioc)),
        timer_(socket_.get_executor()),
        body_(std::move(body)),
        record_(std::move(record)),
        keep_text_(keep_text),
        done_(std::move(done)) {
    record_.chunk_s.reserve(static_cast<size_t>(std::max(0, record_.expected_output_tokens)) + 2);
  }

  void start() {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->begin(); });
  }

 private:
  void begin() {
    // The send time is when the request starts (connect, then write), as a
    // client that opens a connection per request sees it.
    record_.send_s = client_.since_origin();
    arm_timer(client_.options.timeout_s);
    asio::async_connect(socket_, client_.endpoints, [self = shared_from_this()](error_code ec, const tcp::endpoint&) {
      self->on_connect(ec);
    });
  }

  // Closes the connection after `seconds` unless the request has finished.
  void arm_timer(double seconds) {
    timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(seconds)));
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->finished_) return;
      self->timed_out_ = true;
      error_code ignored;
      self->socket_.close(ignored);  // pending operations complete with operation_aborted
    });
  }

  void on_connect(error_code ec) {
    if (ec) return fail(timed_out_ ? ErrorKind::kTimeout : ErrorKind::kConnect, "connect: " + ec.message());
    error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);
    request_ = "POST " + client_.target + " HTTP/1.1\r\nHost: " + client_.host_header +
               "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\n";
    if (!client_.options.api_key.empty()) request_ += "Authorization: Bearer " + client_.options.api_key + "\r\n";
    request_ += "Content-Length: " + std::to_string(body_.size()) + "\r\n\r\n";
    std::array<asio::const_buffer, 2> bufs{asio::buffer(request_), asio::buffer(body_)};
    asio::async_write(socket_, bufs, [self = shared_from_this()](error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(error_code ec) {
    if (ec) return fail(timed_out_ ? ErrorKind::kTimeout : ErrorKind::kDisconnect, "write: " + ec.message());
    parser_.emplace();
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    http::async_read_header(socket_, in_, *parser_,
                            [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(error_code ec) {
    if (ec) {
      return fail(timed_out_ ? ErrorKind::kTimeout : ErrorKind::kDisconnect,
                  "connection closed before the response: " + ec.message());
    }
    status_ = parser_->get().result_int();
    record_.http_status = status_;
    read_body();
  }

  void read_body() {
    if (parser_->is_done()) return on_body_end();
    parser_->get().body().data = buf_.data();
    parser_->get().body().size = buf_.size();
    http::async_read_some(socket_, in_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      self->on_body(ec);
    });
  }

  void on_body(error_code ec) {
    if (ec == http::error::need_buffer) ec = {};
    const size_t n = buf_.size() - parser_->get().body().size;
    if (n > 0) {
      if (status_ / 100 != 2) {
        const size_t room = client_.options.max_error_body_bytes - std::min(client_.options.max_error_body_bytes,
                                                                            error_body_.size());
        error_body_.append(buf_.data(), std::min(n, room));
      } else if (!consume(std::string_view(buf_.data(), n))) {
        return;  // finished (at [DONE]) or failed
      }
    }
    if (ec) {
      if (saw_done_ && status_ / 100 == 2) return succeed();  // the stream was complete
      if (timed_out_) return fail(ErrorKind::kTimeout, "timed out after " + std::to_string(client_.options.timeout_s) + " s");
      if (status_ / 100 != 2) return fail_status();
      return fail(ErrorKind::kDisconnect, "disconnected mid-stream: " + ec.message());
    }
    read_body();
  }

  void on_body_end() {
    if (status_ / 100 != 2) return fail_status();
    if (!saw_done_) {
      return fail(sse_.has_partial() ? ErrorKind::kMalformed : ErrorKind::kDisconnect,
                  "the stream ended without data: [DONE]");
    }
    succeed();
  }

  // Feeds stream bytes; false once the request has finished.
  bool consume(std::string_view bytes) {
    bool go_on = true;
    const bool fed = sse_.feed(bytes, [&](std::string_view data) {
      if (!go_on || saw_done_) return;  // events after [DONE] are ignored
      const double now = client_.since_origin();
      ChunkInfo c = parse_openai_chunk(data, keep_text_ ? &text_ : nullptr);
      if (c.done) {
        // The request ends here; the rest of the response (the chunked
        // terminator) is still read, for a clean finish on the server's side,
        // but for 2 s at most.
        saw_done_ = true;
        record_.end_s = now;
        arm_timer(std::min(2.0, client_.options.timeout_s));
        return;
      }
      if (c.malformed) {
        go_on = false;
        fail(ErrorKind::kMalformed, "malformed stream event: " + std::string(data.substr(0, 200)));
        return;
      }
      if (c.error) {
        go_on = false;
        fail(ErrorKind::kOther, "error event: " + c.error_message.substr(0, 200));
        return;
      }
      if (c.has_token) {
        if (record_.chunk_s.empty()) record_.first_token_s = now;
        record_.chunk_s.push_back(now);
      }
      if (c.has_usage) {
        record_.usage_reported = true;
        record_.prompt_tokens = c.prompt_tokens;
        record_.output_tokens = c.completion_tokens;
      }
    });
    if (!fed && go_on) {
      fail(ErrorKind::kMalformed, "a stream event exceeds the size limit");
      return false;
    }
    return go_on;
  }

  void fail_status() {
    std::string msg = "HTTP " + std::to_string(status_);
    if (!error_body_.empty()) msg += ": " + error_body_.substr(0, 300);
    fail(ErrorKind::kHttpStatus, msg);
  }

  void succeed() {
    if (finished_) return;
    if (!saw_done_) record_.end_s = client_.since_origin();
    if (!record_.usage_reported) record_.output_tokens = static_cast<int>(record_.chunk_s.size());
    finish();
  }

  void fail(ErrorKind kind, std::string message) {
    if (finished_) return;
    record_.error = kind;
    record_.error_message = std::move(message);
    record_.end_s = client_.since_origin();
    finish();
  }

  void finish() {
    finished_ = true;
    timer_.cancel();
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    if (done_) {
      auto done = std::move(done_);
      done(std::move(record_), std::move(text_));
    }
  }

  StreamClient::Impl& client_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  std::string request_;  // request line and headers
  std::string body_;
  RequestRecord record_;
  bool keep_text_;
  StreamClient::Done done_;
  boost::beast::flat_buffer in_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  std::array<char, 16384> buf_{};
  SseParser sse_;
  std::string text_;
  std::string error_body_;
  int status_ = 0;
  bool saw_done_ = false;
  bool timed_out_ = false;
  bool finished_ = false;
};

}  // namespace

StreamClient::StreamClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StreamClient::~StreamClient() {
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
}

Expected<std::unique_ptr<StreamClient>> StreamClient::create(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->target = options.url.prefix + options.path;
  impl->host_header = options.url.host;
  if (options.url.port != "80") impl->host_header += ":" + options.url.port;
  if (options.timeout_s <= 0) return invalid_argument("the request timeout must be > 0");
  tcp::resolver resolver(impl->ioc);
  error_code ec;
  impl->endpoints = resolver.resolve(options.url.host, options.url.port, ec);
  if (ec) return not_found("cannot resolve " + options.url.host + ": " + ec.message());
  impl->work.emplace(impl->ioc.get_executor());
  for (int i = 0; i < std::max(1, options.num_io_threads); ++i)
    impl->threads.emplace_back([ioc = &impl->ioc] { ioc->run(); });
  return std::unique_ptr<StreamClient>(new StreamClient(std::move(impl)));
}

void StreamClient::send(std::string body, RequestRecord record, bool keep_text, Done done) {
  std::make_shared<Session>(*impl_, std::move(body), std::move(record), keep_text, std::move(done))->start();
}

void StreamClient::post_after(double delay_s, std::function<void()> fn) {
  if (delay_s <= 0) {
    asio::post(impl_->ioc, std::move(fn));
    return;
  }
  auto timer = std::make_shared<asio::steady_timer>(impl_->ioc);
  timer->expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(delay_s)));
  timer->async_wait([timer, fn = std::move(fn)](error_code ec) {
    if (!ec) fn();
  });
}

double StreamClient::now() const { return impl_->since_origin(); }

}  // namespace osprey::bench
