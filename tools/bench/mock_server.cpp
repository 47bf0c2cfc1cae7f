#include "bench/mock_server.h"

#include <atomic>
#include <cstdio>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace osprey::bench {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

struct MockServer::Impl {
  MockServerOptions options;
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::atomic<int64_t> requests{0}, chunks{0};
  int port = 0;
  bool stopped = false;
};

namespace {

// Whitespace-separated words: the mock's "token" count of a prompt.
int count_words(const std::string& s) {
  int n = 0;
  bool in_word = false;
  for (char c : s) {
    const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (!space && !in_word) ++n;
    in_word = !space;
  }
  return n;
}

int prompt_tokens_of(const nlohmann::json& body) {
  int n = 0;
  if (auto p = body.find("prompt"); p != body.end()) {
    if (p->is_string()) n = count_words(p->get<std::string>());
    if (p->is_array()) n = static_cast<int>(p->size());
  }
  if (auto m = body.find("messages"); m != body.end() && m->is_array()) {
    for (const auto& msg : *m)
      if (msg.is_object() && msg.contains("content") && msg["content"].is_string())
        n += count_words(msg["content"].get<std::string>());
  }
  return n;
}

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(MockServer::Impl& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), timer_(socket_.get_executor()) {}

  void start() {
    parser_.emplace();
    parser_->body_limit(64u << 20);
    http::async_read(socket_, in_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      self->on_request(ec);
    });
  }

 private:
  void on_request(error_code ec) {
    if (ec) return close();
    ++server_.requests;
    const auto& req = parser_->get();
    const std::string target(req.target());
    chat_ = target.find("/chat/completions") != std::string::npos;
    if (req.method() != http::verb::post ||
        (!chat_ && target.find("/completions") == std::string::npos))
      return respond_error(404, "not found");
    const nlohmann::json body = nlohmann::json::parse(req.body(), nullptr, false);
    if (!body.is_object()) return respond_error(400, "the body is not a JSON object");
    max_tokens_ = server_.options.default_max_tokens;
    if (auto m = body.find("max_tokens"); m != body.end() && m->is_number_integer()) max_tokens_ = m->get<int>();
    if (auto m = body.find("max_completion_tokens"); m != body.end() && m->is_number_integer())
      max_tokens_ = m->get<int>();
    if (max_tokens_ < 1) return respond_error(400, "max_tokens must be >= 1");
    prompt_tokens_ = prompt_tokens_of(body);
    const std::string model = body.value("model", std::string());
    if (model.rfind("fail-", 0) == 0) return respond_error(std::atoi(model.c_str() + 5), "mock failure");
    if (model.rfind("disconnect-", 0) == 0) {
      mode_ = Mode::kDisconnect;
      limit_ = std::atoi(model.c_str() + 11);
    } else if (model.rfind("stall-", 0) == 0) {
      mode_ = Mode::kStall;
      limit_ = std::atoi(model.c_str() + 6);
    } else if (model == "malformed") {
      mode_ = Mode::kMalformed;
      limit_ = 1;
    } else if (model == "nousage") {
      mode_ = Mode::kNoUsage;
    } else if (model == "nodone") {
      mode_ = Mode::kNoDone;
    } else if (model == "linger") {
      mode_ = Mode::kLinger;
    }
    out_ =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    write_more();
  }

  void respond_error(int status, const std::string& message) {
    if (status < 100 || status > 599) status = 500;
    const std::string body = nlohmann::json{{"error", {{"message", message}, {"type", "mock"}, {"code", status}}}}.dump();
    out_ = "HTTP/1.1 " + std::to_string(status) + " Mock\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    asio::async_write(socket_, asio::buffer(out_), [self = shared_from_this()](error_code, size_t) { self->close(); });
  }

  void add_event(const std::string& data) {
    const std::string ev = "data: " + data + "\n\n";
    char hex[32];
    std::snprintf(hex, sizeof hex, "%zx\r\n", ev.size());
    out_ += hex;
    out_ += ev;
    out_ += "\r\n";
  }

  std::string token_chunk(bool last) const {
    const char* finish = last ? "\"length\"" : "null";
    if (chat_)
      return std::string(R"({"id":"chatcmpl-mock","object":"chat.completion.chunk","model":"mock","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":)") +
             finish + "}]}";
    return std::string(R"({"id":"cmpl-mock","object":"text_completion","model":"mock","choices":[{"index":0,"text":" tok","finish_reason":)") +
           finish + "}]}";
  }

  // Appends the next events (a batch when there is no delay) and writes them.
  void write_more() {
    const int batch = server_.options.token_delay_us > 0 ? 1 : 16;
    bool end = false;
    for (int i = 0; i < batch && !end; ++i) {
      if (sent_ < max_tokens_ && !(limit_ >= 0 && sent_ >= limit_)) {
        add_event(token_chunk(sent_ + 1 == max_tokens_));
        ++sent_;
        ++server_.chunks;
        continue;
      }
      end = true;
    }
    if (end) {
      if (limit_ >= 0 && sent_ >= limit_ && sent_ < max_tokens_ + 1) {
        if (mode_ == Mode::kDisconnect) {
          return flush([](Connection& c) { c.close(); });
        }
        if (mode_ == Mode::kStall) {
          return flush([](Connection& c) { c.wait_for_client(); });
        }
        if (mode_ == Mode::kMalformed) {
          add_event("{\"choices\": [oops");
          out_ += "0\r\n\r\n";
          return flush([](Connection& c) { c.close(); });
        }
      }
      if (mode_ != Mode::kNoUsage)
        add_event(R"({"id":"cmpl-mock","choices":[],"usage":{"prompt_tokens":)" + std::to_string(prompt_tokens_) +
                  ",\"completion_tokens\":" + std::to_string(sent_) +
                  ",\"total_tokens\":" + std::to_string(prompt_tokens_ + sent_) + "}}");
      if (mode_ != Mode::kNoDone) add_event("[DONE]");
      if (mode_ == Mode::kLinger) return flush([](Connection& c) { c.wait_for_client(); });
      out_ += "0\r\n\r\n";
      return flush([](Connection& c) { c.close(); });
    }
    flush([](Connection& c) {
      if (c.server_.options.token_delay_us > 0) {
        c.timer_.expires_after(std::chrono::microseconds(c.server_.options.token_delay_us));
        c.timer_.async_wait([self = c.shared_from_this()](error_code ec) {
          if (!ec) self->write_more();
        });
      } else {
        c.write_more();
      }
    });
  }

  template <class Next>
  void flush(Next next) {
    wbuf_.swap(out_);
    out_.clear();
    asio::async_write(socket_, asio::buffer(wbuf_), [self = shared_from_this(), next](error_code ec, size_t) {
      if (ec) return self->close();
      next(*self);
    });
  }

  void wait_for_client() {
    socket_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->close();
      self->wait_for_client();
    });
  }

  void close() {
    error_code ignored;
    timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  enum class Mode { kNormal, kDisconnect, kStall, kMalformed, kNoUsage, kNoDone, kLinger };
  MockServer::Impl& server_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  boost::beast::flat_buffer in_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string out_, wbuf_;
  char scratch_[512];
  bool chat_ = false;
  Mode mode_ = Mode::kNormal;
  int limit_ = -1;  // token chunks before the misbehaviour; -1: none
  int max_tokens_ = 0, prompt_tokens_ = 0, sent_ = 0;
};

void accept_loop(MockServer::Impl* s) {
  s->acceptor->async_accept(asio::make_strand(s->ioc), [s](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !s->acceptor->is_open()) return;
    if (!ec) {
      error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Connection>(*s, std::move(socket))->start();
    }
    accept_loop(s);
  });
}

}  // namespace

MockServer::MockServer(MockServerOptions options) : impl_(std::make_shared<Impl>()) {
  impl_->options = std::move(options);
}

MockServer::~MockServer() { stop(); }

Status MockServer::start() {
  error_code ec;
  const auto addr = asio::ip::make_address(impl_->options.host, ec);
  if (ec) return invalid_argument("bad host " + impl_->options.host);
  tcp::endpoint ep(addr, static_cast<unsigned short>(impl_->options.port));
  impl_->acceptor.emplace(asio::make_strand(impl_->ioc));
  impl_->acceptor->open(ep.protocol(), ec);
  if (!ec) impl_->acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor->bind(ep, ec);
  if (!ec) impl_->acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status(StatusCode::kUnavailable, "cannot listen on " + impl_->options.host + ":" +
                                                      std::to_string(impl_->options.port) + ": " + ec.message());
  impl_->port = impl_->acceptor->local_endpoint().port();
  impl_->work.emplace(impl_->ioc.get_executor());
  accept_loop(impl_.get());
  for (int i = 0; i < std::max(1, impl_->options.num_io_threads); ++i)
    impl_->threads.emplace_back([ioc = &impl_->ioc] { ioc->run(); });
  return Status::Ok();
}

int MockServer::port() const { return impl_->port; }

void MockServer::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  if (impl_->acceptor) {
    asio::post(impl_->acceptor->get_executor(), [s = impl_.get()] {
      error_code ignored;
      s->acceptor->close(ignored);
    });
  }
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

MockServerCounters MockServer::counters() const { return {impl_->requests.load(), impl_->chunks.load()}; }

}  // namespace osprey::bench
