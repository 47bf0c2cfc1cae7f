#include "server/http_server.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "server/json_util.h"

namespace osprey::server {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

const char* http_reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

namespace {

// Bytes of pipelined input buffered while a request is handled, at most.
constexpr size_t kMaxBufferedInput = size_t{1} << 20;
// After a response that closes the connection, unread input is drained for
// this long (so the client sees the response instead of a reset).
constexpr std::chrono::milliseconds kLingerTime{2000};
constexpr size_t kLingerMaxBytes = size_t{256} << 20;

bool sane_request_id(std::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == ':')) return false;
  return true;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string json_error_body(int status, const std::string& message, const char* code) {
  ApiError e{status, message, "invalid_request_error", "", code, 0};
  return dump_json(e.to_json());
}

}  // namespace

class Session;

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  HttpServerOptions options;
  HttpHandler handler;
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  tcp::acceptor acceptor{asio::make_strand(ioc)};  // accept handlers and close() serialised on its strand
  std::unique_ptr<asio::thread_pool> workers;
  std::vector<std::thread> io_threads;
  std::atomic<bool> draining{false};
  std::atomic<bool> stopped{false};
  std::atomic<int64_t> open_connections{0}, accepted{0};
  int bound_port = 0;
  std::mutex sessions_mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;

  void do_accept();
  void add(const std::shared_ptr<Session>& s);
  void remove(Session* s);
  void post_handler(HttpRequest req, std::shared_ptr<ResponseWriter> writer) {
    asio::post(*workers, [this, req = std::move(req), writer = std::move(writer)]() mutable {
      handler(std::move(req), std::move(writer));
    });
  }
  std::string cors_origin_for(std::string_view origin) const {
    for (const std::string& o : options.cors_origins) {
      if (o == "*") return "*";
      if (!origin.empty() && o == origin) return o;
    }
    return {};
  }
};

// One connection. Every member is touched only on the strand, except the
// atomics and what ResponseWriterImpl guards with its mutex.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<HttpServer::Impl> server)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), server_(std::move(server)) {
    error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
    socket_.set_option(tcp::no_delay(true), ec);
  }

  void start() {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] {
      self->enter_idle();
      self->do_read();
    });
  }
  // From any thread: close if no request is in progress (drain).
  void close_if_idle() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      if (self->state_ == State::kIdle && self->in_.size() == 0) self->close();
    });
  }
  void force_close() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->close(); });
  }

  // ---- called (on the strand) through the current request's writer ----
  class Writer;
  void send_whole(Writer* w, HttpResponse r);
  void start_stream(Writer* w, int status, std::string content_type,
                    std::vector<std::pair<std::string, std::string>> headers);
  void write_chunk(Writer* w, std::string data);
  void finish_stream(Writer* w);

 private:
  enum class State { kIdle, kReading, kHandling, kLinger, kClosed };

  void arm_timer(std::chrono::milliseconds after) {
    const uint64_t gen = ++timer_gen_;
    timer_.expires_after(after);
    timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
      if (ec || gen != self->timer_gen_) return;
      self->on_timeout();
    });
  }
  void disarm_timer() {
    ++timer_gen_;
    timer_.cancel();
  }

  void enter_idle() {
    state_ = State::kIdle;
    arm_timer(server_->options.keep_alive_timeout);
  }

  void do_read() {
    if (reading_ || state_ == State::kClosed) return;
    if (state_ == State::kHandling && in_.size() >= kMaxBufferedInput) return;  // resumed after the response
    reading_ = true;
    // Reads land in rbuf_, never in in_: in_ is consumed while this read is
    // pending, which would move the region a read into in_.prepare() targets.
    socket_.async_read_some(asio::buffer(rbuf_), [self = shared_from_this()](error_code ec, size_t n) {
      self->reading_ = false;
      self->on_read(ec, n);
    });
  }

  void on_read(error_code ec, size_t n) {
    if (state_ == State::kClosed) return;
    if (ec) {
      on_peer_gone();
      return;
    }
    if (state_ == State::kLinger) {
      linger_bytes_ += n;
      if (linger_bytes_ > kLingerMaxBytes) {
        close();
        return;
      }
      do_read();
      return;
    }
    in_.commit(asio::buffer_copy(in_.prepare(n), asio::buffer(rbuf_.data(), n)));
    process_input();
    do_read();
  }

  void process_input() {
    while ((state_ == State::kIdle || state_ == State::kReading) && in_.size() > 0) {
      if (state_ == State::kIdle) {
        parser_.emplace();
        parser_->body_limit(server_->options.max_body_bytes);
        parser_->header_limit(static_cast<std::uint32_t>(server_->options.max_header_bytes));
        state_ = State::kReading;
        arm_timer(server_->options.request_timeout);
      }
      error_code ec;
      const size_t used = parser_->put(in_.data(), ec);
      in_.consume(used);
      if (ec == http::error::need_more) {
        if (used == 0) {
          // A header larger than the buffer can hold stays incomplete forever.
          if (in_.size() > server_->options.max_header_bytes + 16384) {
            reject(431, "The request headers are too large.", "headers_too_large");
          }
          return;
        }
        continue;
      }
      if (ec) {
        if (ec == http::error::body_limit)
          reject(413,
                 "The request body is larger than the limit of " + std::to_string(server_->options.max_body_bytes) +
                     " bytes.",
                 "payload_too_large");
        else if (ec == http::error::header_limit)
          reject(431, "The request headers are too large.", "headers_too_large");
        else
          reject(400, "Malformed HTTP request: " + ec.message() + ".", "bad_http_request");
        return;
      }
      if (parser_->is_done()) {
        dispatch_request();
        return;
      }
    }
  }

  // Answers a transport-level error and closes the connection afterwards.
  void reject(int status, const std::string& message, const char* code) {
    if (server_->options.on_transport_error) server_->options.on_transport_error(status);
    disarm_timer();
    state_ = State::kHandling;
    keep_alive_ = false;
    request_id_ = random_id("req-");
    origin_.clear();
    HttpResponse r;
    r.status = status;
    r.body = json_error_body(status, message, code);
    response_started_ = true;
    queue(format_head(r.status, r.content_type, r.headers, r.body.size(), false) + r.body);
    response_complete_ = true;
  }

  void dispatch_request();

  std::string format_head(int status, const std::string& content_type,
                          const std::vector<std::pair<std::string, std::string>>& headers, size_t content_length,
                          bool chunked) {
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " + http_reason(status) + "\r\n";
    h += "Server: osprey\r\n";
    if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
    if (chunked)
      h += "Transfer-Encoding: chunked\r\n";
    else
      h += "Content-Length: " + std::to_string(content_length) + "\r\n";
    h += "X-Request-Id: " + request_id_ + "\r\n";
    if (server_->draining) keep_alive_ = false;
    h += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    const std::string allow = server_->cors_origin_for(origin_);
    if (!allow.empty()) {
      h += "Access-Control-Allow-Origin: " + allow + "\r\n";
      if (allow != "*") h += "Vary: Origin\r\n";
      h += "Access-Control-Expose-Headers: X-Request-Id, Retry-After\r\n";
    }
    for (const auto& [k, v] : headers) {
      // Header injection guard: values come from our own code, but never let CR/LF through.
      if (k.find_first_of("\r\n") != std::string::npos || v.find_first_of("\r\n") != std::string::npos) continue;
      h += k + ": " + v + "\r\n";
    }
    h += "\r\n";
    return h;
  }

  void queue(std::string bytes) {
    out_.push_back(std::move(bytes));
    if (!writing_) start_write();
  }

  void start_write() {
    if (state_ == State::kClosed) return;
    if (out_.empty()) {
      if (response_complete_ && state_ == State::kHandling) on_response_done();
      return;
    }
    wbuf_.clear();
    for (std::string& s : out_) wbuf_ += s;
    out_.clear();
    writing_ = true;
    arm_timer(server_->options.write_timeout);
    asio::async_write(socket_, asio::buffer(wbuf_), [self = shared_from_this()](error_code ec, size_t) {
      self->writing_ = false;
      if (self->state_ == State::kClosed) return;
      self->disarm_timer();
      if (ec) {
        self->on_peer_gone();
        return;
      }
      self->start_write();
    });
  }

  void on_response_done() {
    writer_.reset();
    if (!keep_alive_ || server_->draining) {
      linger_close();
      return;
    }
    enter_idle();
    process_input();
    do_read();
  }

  // Half-closes, then drains what the client still sends for a while, so the
  // response is read instead of being lost to a connection reset.
  void linger_close() {
    state_ = State::kLinger;
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) {
      close();
      return;
    }
    in_.consume(in_.size());
    arm_timer(kLingerTime);
    do_read();
  }

  void on_timeout() {
    switch (state_) {
      case State::kReading:
        // A request started but did not arrive in time (slow client).
        reject(408, "The request was not received in time.", "request_timeout");
        return;
      case State::kHandling:  // a write made no progress: the client is gone or stuck
        on_peer_gone();
        return;
      default:
        close();
    }
  }

  void on_peer_gone() {
    if (state_ == State::kHandling && !response_complete_) fire_disconnect();
    close();
  }

  void fire_disconnect();

  void close() {
    if (state_ == State::kClosed) return;
    if (state_ == State::kHandling && !(response_complete_ && out_.empty() && !writing_)) fire_disconnect();
    state_ = State::kClosed;
    disarm_timer();
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    writer_.reset();
    server_->remove(this);
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  std::shared_ptr<HttpServer::Impl> server_;
  std::string remote_;
  State state_ = State::kIdle;
  uint64_t timer_gen_ = 0;
  boost::beast::flat_buffer in_;    // received, not yet parsed
  std::array<char, 16384> rbuf_{};  // target of the pending read
  bool reading_ = false;
  std::optional<http::request_parser<http::string_body>> parser_;
  size_t linger_bytes_ = 0;
  // The request being handled.
  std::string request_id_;
  std::string origin_;
  bool keep_alive_ = true;
  bool response_started_ = false;
  bool response_complete_ = false;
  bool disconnect_fired_ = false;
  bool chunked_ = false;
  std::shared_ptr<Writer> writer_;
  // Output.
  std::deque<std::string> out_;
  std::string wbuf_;
  bool writing_ = false;
};

class Session::Writer : public ResponseWriter, public std::enable_shared_from_this<Session::Writer> {
 public:
  Writer(std::shared_ptr<Session> s, std::string id) : session_(std::move(s)), id_(std::move(id)) {}

  void send(HttpResponse r) override {
    post([r = std::move(r)](Session& s, Writer* w) mutable { s.send_whole(w, std::move(r)); });
  }
  void start_stream(int status, std::string ct, std::vector<std::pair<std::string, std::string>> headers) override {
    post([status, ct = std::move(ct), headers = std::move(headers)](Session& s, Writer* w) mutable {
      s.start_stream(w, status, std::move(ct), std::move(headers));
    });
  }
  void write(std::string data) override {
    post([data = std::move(data)](Session& s, Writer* w) mutable { s.write_chunk(w, std::move(data)); });
  }
  void finish() override {
    post([](Session& s, Writer* w) { s.finish_stream(w); });
  }
  void on_disconnect(std::function<void()> fn) override {
    std::unique_lock lock(mu_);
    if (gone_) {
      lock.unlock();
      if (fn) fn();
      return;
    }
    on_gone_ = std::move(fn);
  }
  bool disconnected() const override {
    std::lock_guard lock(mu_);
    return gone_;
  }
  const std::string& request_id() const override { return id_; }

  // On the strand: the client went away before the response completed.
  void mark_gone() {
    std::function<void()> fn;
    {
      std::lock_guard lock(mu_);
      if (gone_) return;
      gone_ = true;
      fn = std::move(on_gone_);
      on_gone_ = nullptr;
    }
    if (fn) fn();
  }
  // On the strand: the response is complete; drop the callback (and what it holds).
  void mark_done() {
    std::lock_guard lock(mu_);
    on_gone_ = nullptr;
  }

 private:
  template <class F>
  void post(F&& f) {
    std::shared_ptr<Session> s;
    {
      std::lock_guard lock(mu_);
      s = session_.lock();
    }
    if (!s) return;
    auto self = shared_from_this();
    asio::post(s->socket_.get_executor(), [s, self, f = std::forward<F>(f)]() mutable { f(*s, self.get()); });
  }
  mutable std::mutex mu_;
  std::weak_ptr<Session> session_;
  std::string id_;
  bool gone_ = false;
  std::function<void()> on_gone_;
};

void Session::fire_disconnect() {
  if (disconnect_fired_) return;
  disconnect_fired_ = true;
  if (writer_) writer_->mark_gone();
}

void Session::dispatch_request() {
  disarm_timer();
  state_ = State::kHandling;
  auto& msg = parser_->get();
  HttpRequest req;
  req.method = std::string(msg.method_string());
  const std::string_view target(msg.target().data(), msg.target().size());
  const size_t q = target.find('?');
  req.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) req.query = std::string(target.substr(q + 1));
  for (const auto& f : msg)
    req.headers.emplace_back(lower(std::string_view(f.name_string().data(), f.name_string().size())),
                             std::string(f.value().data(), f.value().size()));
  req.body = std::move(msg.body());
  const std::string_view given_id = req.header("x-request-id");
  req.request_id = sane_request_id(given_id) ? std::string(given_id) : random_id("req-");
  req.remote = remote_;
  keep_alive_ = msg.keep_alive() && !server_->draining;
  origin_ = std::string(req.header("origin"));
  request_id_ = req.request_id;
  parser_.reset();
  response_started_ = response_complete_ = false;
  disconnect_fired_ = false;

  // CORS preflight is answered here.
  if (req.method == "OPTIONS" && !server_->options.cors_origins.empty()) {
    HttpResponse r;
    r.status = 204;
    r.content_type.clear();
    r.headers = {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                 {"Access-Control-Allow-Headers", "Authorization, Content-Type, X-Request-Id"},
                 {"Access-Control-Max-Age", "600"}};
    response_started_ = true;
    queue(format_head(r.status, r.content_type, r.headers, 0, false));
    response_complete_ = true;
    return;
  }
  writer_ = std::make_shared<Writer>(shared_from_this(), request_id_);
  server_->post_handler(std::move(req), writer_);
  do_read();  // watch for a disconnect while the handler works
}

void Session::send_whole(Writer* w, HttpResponse r) {
  if (state_ != State::kHandling || writer_.get() != w || response_started_) return;
  response_started_ = true;
  chunked_ = false;
  queue(format_head(r.status, r.content_type, r.headers, r.body.size(), false) + r.body);
  response_complete_ = true;
  w->mark_done();
  if (!writing_) start_write();
}

void Session::start_stream(Writer* w, int status, std::string content_type,
                           std::vector<std::pair<std::string, std::string>> headers) {
  if (state_ != State::kHandling || writer_.get() != w || response_started_) return;
  response_started_ = true;
  chunked_ = true;
  headers.emplace_back("Cache-Control", "no-cache");
  headers.emplace_back("X-Accel-Buffering", "no");
  queue(format_head(status, content_type, headers, 0, true));
}

void Session::write_chunk(Writer* w, std::string data) {
  if (state_ != State::kHandling || writer_.get() != w || !chunked_ || response_complete_ || data.empty()) return;
  char size[24];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string c = size;
  c += data;
  c += "\r\n";
  queue(std::move(c));
}

void Session::finish_stream(Writer* w) {
  if (state_ != State::kHandling || writer_.get() != w || !chunked_ || response_complete_) return;
  response_complete_ = true;
  w->mark_done();
  queue("0\r\n\r\n");
}

// ---- server ----

void HttpServer::Impl::add(const std::shared_ptr<Session>& s) {
  std::lock_guard lock(sessions_mu);
  sessions[s.get()] = s;
}

void HttpServer::Impl::remove(Session* s) {
  std::lock_guard lock(sessions_mu);
  if (sessions.erase(s)) --open_connections;
}

void HttpServer::Impl::do_accept() {
  acceptor.async_accept(asio::make_strand(ioc), [self = shared_from_this()](error_code ec, tcp::socket socket) {
    if (!self->acceptor.is_open() || self->draining || self->stopped) return;
    if (ec) {
      // E.g. out of file descriptors: back off instead of spinning.
      auto t = std::make_shared<asio::steady_timer>(self->acceptor.get_executor(), std::chrono::milliseconds(50));
      t->async_wait([self, t](error_code) { self->do_accept(); });
      return;
    }
    auto session = std::make_shared<Session>(std::move(socket), self);
    ++self->open_connections;
    ++self->accepted;
    self->add(session);
    session->start();
    self->do_accept();
  });
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler) : impl_(std::make_shared<Impl>()) {
  impl_->options = std::move(options);
  impl_->handler = std::move(handler);
}

HttpServer::~HttpServer() {
  stop();
}

Status HttpServer::start() {
  Impl& m = *impl_;
  error_code ec;
  const auto address = asio::ip::make_address(m.options.host, ec);
  if (ec) return invalid_argument("invalid --host '" + m.options.host + "': " + ec.message());
  const tcp::endpoint ep(address, static_cast<unsigned short>(m.options.port));
  m.acceptor.open(ep.protocol(), ec);
  if (!ec) m.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(ep, ec);
  if (!ec) m.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return Status(StatusCode::kUnavailable,
                  "cannot listen on " + m.options.host + ":" + std::to_string(m.options.port) + ": " + ec.message());
  m.bound_port = m.acceptor.local_endpoint().port();
  m.workers = std::make_unique<asio::thread_pool>(std::max(1, m.options.num_worker_threads));
  m.work.emplace(m.ioc.get_executor());
  m.do_accept();
  for (int i = 0; i < std::max(1, m.options.num_io_threads); ++i) m.io_threads.emplace_back([&m] { m.ioc.run(); });
  return Status::Ok();
}

int HttpServer::port() const {
  return impl_->bound_port;
}

void HttpServer::begin_drain() {
  Impl& m = *impl_;
  if (m.draining.exchange(true)) return;
  asio::post(m.acceptor.get_executor(), [&m] {
    error_code ec;
    m.acceptor.close(ec);
  });
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard lock(m.sessions_mu);
    for (auto& [p, w] : m.sessions)
      if (auto s = w.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->close_if_idle();
}

void HttpServer::stop() {
  Impl& m = *impl_;
  if (m.stopped.exchange(true)) return;
  m.draining = true;
  if (!m.io_threads.empty()) {
    asio::post(m.acceptor.get_executor(), [&m] {
      error_code ec;
      m.acceptor.close(ec);
    });
    std::vector<std::shared_ptr<Session>> live;
    {
      std::lock_guard lock(m.sessions_mu);
      for (auto& [p, w] : m.sessions)
        if (auto s = w.lock()) live.push_back(std::move(s));
    }
    for (auto& s : live) s->force_close();
    live.clear();
    m.work.reset();
    if (m.workers) m.workers->join();
    // Give pending closes a moment, then stop the loop.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (m.open_connections > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m.ioc.stop();
    for (auto& t : m.io_threads) t.join();
    m.io_threads.clear();
  }
}

HttpServerCounters HttpServer::counters() const {
  return {impl_->open_connections.load(), impl_->accepted.load()};
}

}  // namespace osprey::server
