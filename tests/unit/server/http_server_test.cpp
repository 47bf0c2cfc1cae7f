// The transport and the OpenAI routes end to end over loopback, against the
// FakeBackend (no model needed).
#include <gtest/gtest.h>

#include <atomic>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <thread>

#include "fake_backend.h"
#include "server/http_server.h"
#include "server/openai_service.h"

namespace osprey::server {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::ordered_json;
using testing::FakeBackend;

struct Reply {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  json json_body() const { return json::parse(body, nullptr, false); }
};

class Client {
 public:
  explicit Client(int port) : socket_(ioc_) {
    socket_.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  }
  void send_raw(const std::string& bytes) { asio::write(socket_, asio::buffer(bytes)); }
  void send(const std::string& method, const std::string& path, const std::string& body = "",
            std::vector<std::pair<std::string, std::string>> headers = {}) {
    std::string r = method + " " + path + " HTTP/1.1\r\nHost: x\r\n";
    for (auto& [k, v] : headers) r += k + ": " + v + "\r\n";
    if (!body.empty() || method == "POST")
      r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    r += "\r\n" + body;
    send_raw(r);
  }
  Reply read() {
    http::response_parser<http::string_body> p;
    p.body_limit(std::numeric_limits<std::uint64_t>::max());
    boost::system::error_code ec;
    http::read(socket_, buf_, p, ec);
    Reply r;
    if (ec) return r;  // status 0
    r.status = p.get().result_int();
    for (const auto& f : p.get()) {
      std::string k(f.name_string());
      for (char& c : k) c = static_cast<char>(std::tolower(c));
      r.headers[k] = std::string(f.value());
    }
    r.body = p.get().body();
    return r;
  }
  Reply request(const std::string& method, const std::string& path, const std::string& body = "",
                std::vector<std::pair<std::string, std::string>> headers = {}) {
    send(method, path, body, std::move(headers));
    return read();
  }
  // Reads raw bytes until `needle` was seen (or EOF).
  std::string read_until(const std::string& needle) {
    std::string got;
    char b[4096];
    while (got.find(needle) == std::string::npos) {
      boost::system::error_code ec;
      size_t n = socket_.read_some(asio::buffer(b), ec);
      if (ec) break;
      got.append(b, n);
    }
    return got;
  }
  bool closed_by_peer() {
    char b[64];
    boost::system::error_code ec;
    socket_.read_some(asio::buffer(b), ec);
    return ec == asio::error::eof || ec == asio::error::connection_reset;
  }
  void close() {
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

 private:
  asio::io_context ioc_;
  tcp::socket socket_;
  boost::beast::flat_buffer buf_;
};

// The data: payloads of an SSE body, in order.
std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

class ServerTest : public ::testing::Test {
 protected:
  void start(ServiceOptions so = {}, HttpServerOptions ho = {}, std::function<void(FakeBackend&)> setup = nullptr) {
    backend_ = std::make_shared<FakeBackend>();
    if (setup) setup(*backend_);
    if (so.model_names.empty()) so.model_names = {"test-model", "alias"};
    service_ = std::make_shared<OpenAIService>(so);
    service_->set_backend(backend_);
    service_->set_ready(true);
    ho.port = 0;
    ho.request_timeout =
        std::chrono::milliseconds(ho.request_timeout.count() == 30000 ? 500 : ho.request_timeout.count());
    server_ = std::make_unique<HttpServer>(ho, [svc = service_](HttpRequest r, std::shared_ptr<ResponseWriter> w) {
      svc->handle(std::move(r), std::move(w));
    });
    ASSERT_TRUE(server_->start().ok());
    port_ = server_->port();
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (backend_) backend_->shutdown();
  }
  std::string chat_body(json extra = json::object()) {
    json j = {{"model", "test-model"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
    for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
    return j.dump();
  }
  template <class Pred>
  bool wait_for(Pred p, int ms = 3000) {
    for (int i = 0; i < ms / 5; ++i) {
      if (p()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return p();
  }

  std::shared_ptr<FakeBackend> backend_;
  std::shared_ptr<OpenAIService> service_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
};

TEST_F(ServerTest, HealthReadyModelsMetrics) {
  start();
  Client c(port_);
  Reply h = c.request("GET", "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_FALSE(h.headers["x-request-id"].empty());
  EXPECT_EQ(c.request("GET", "/ready").status, 200);
  Reply m = c.request("GET", "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.json_body()["data"][0]["id"], "test-model");
  EXPECT_EQ(m.json_body()["data"][0]["max_model_len"], 512);
  EXPECT_EQ(c.request("GET", "/v1/models/alias").status, 200);
  EXPECT_EQ(c.request("GET", "/v1/models/nope").status, 404);
  Reply p = c.request("GET", "/metrics");
  EXPECT_EQ(p.status, 200);
  EXPECT_NE(p.body.find("osprey:num_requests_running"), std::string::npos);
  EXPECT_NE(p.headers["content-type"].find("text/plain"), std::string::npos);
  service_->set_ready(false);
  EXPECT_EQ(c.request("GET", "/ready").status, 503);
  EXPECT_EQ(c.request("POST", "/v1/chat/completions", chat_body()).status, 503);
}

TEST_F(ServerTest, RequestIdIsEchoed) {
  start();
  Client c(port_);
  Reply r = c.request("GET", "/health", "", {{"X-Request-Id", "abc-123"}});
  EXPECT_EQ(r.headers["x-request-id"], "abc-123");
  Reply bad = c.request("GET", "/health", "", {{"X-Request-Id", "has space"}});
  EXPECT_NE(bad.headers["x-request-id"], "has space");
  EXPECT_FALSE(bad.headers["x-request-id"].empty());
}

TEST_F(ServerTest, ChatNonStreaming) {
  start();
  Client c(port_);
  Reply r = c.request("POST", "/v1/chat/completions", chat_body());
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json_body();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "test-model");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "ok ok ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  // The fake template renders "user: hi\nassistant:" = 19 bytes = 19 tokens.
  EXPECT_EQ(j["usage"]["prompt_tokens"], 19);
  EXPECT_EQ(j["usage"]["completion_tokens"], 7);  // 6 text tokens + EOS
  EXPECT_EQ(j["usage"]["total_tokens"], 26);
  EXPECT_FALSE(j["system_fingerprint"].get<std::string>().empty());
}

TEST_F(ServerTest, ChatStreamingWithUsage) {
  start();
  Client c(port_);
  Reply r = c.request("POST", "/v1/chat/completions",
                      chat_body({{"stream", true}, {"stream_options", {{"include_usage", true}}}, {"max_tokens", 4}}));
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.headers["content-type"].find("text/event-stream"), std::string::npos);
  auto events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  json first = json::parse(events[0]);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  std::string finish;
  std::string id = first["id"];
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json e = json::parse(events[i]);
    EXPECT_EQ(e["id"], id);
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_TRUE(e.contains("usage") && e["usage"].is_null());
    const json& ch = e["choices"][0];
    if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(text, "ok o");
  EXPECT_EQ(finish, "length");
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 4);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 19);
}

TEST_F(ServerTest, CompletionsManyPromptsAndN) {
  start();
  Client c(port_);
  json body = {{"model", "test-model"}, {"prompt", {"ab", "cde"}}, {"n", 2}, {"max_tokens", 2}, {"echo", true}};
  Reply r = c.request("POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json_body();
  EXPECT_EQ(j["object"], "text_completion");
  ASSERT_EQ(j["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], std::string(i < 2 ? "ab" : "cde") + "ok");
    EXPECT_EQ(j["choices"][i]["finish_reason"], "length");
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
}

TEST_F(ServerTest, CompletionLogprobsWithEcho) {
  start();
  Client c(port_);
  json body = {{"model", "test-model"}, {"prompt", "ab"}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}};
  Reply r = c.request("POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json lp = r.json_body()["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"a", "b", "o", "k"}));
  EXPECT_EQ(lp["text_offset"], json({0, 1, 2, 3}));
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][2].get<double>(), -0.5);
  EXPECT_EQ(lp["top_logprobs"][2].size(), 1u);
}

TEST_F(ServerTest, ChatLogprobsStreaming) {
  start();
  Client c(port_);
  Reply r = c.request("POST", "/v1/chat/completions",
                      chat_body({{"stream", true}, {"logprobs", true}, {"top_logprobs", 2}, {"max_tokens", 2}}));
  ASSERT_EQ(r.status, 200);
  int tokens = 0;
  for (const std::string& e : sse_payloads(r.body)) {
    if (e == "[DONE]") continue;
    json j = json::parse(e);
    const json& lp = j["choices"][0]["logprobs"];
    if (lp.is_null()) continue;
    for (const json& t : lp["content"]) {
      ++tokens;
      EXPECT_EQ(t["top_logprobs"].size(), 2u);
    }
  }
  EXPECT_EQ(tokens, 2);
}

TEST_F(ServerTest, ErrorStatuses) {
  start();
  Client c(port_);
  auto expect_error = [&](Reply r, int status, const std::string& what) {
    EXPECT_EQ(r.status, status) << what << ": " << r.body;
    json j = r.json_body();
    ASSERT_TRUE(j.is_object() && j.contains("error")) << what << ": " << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("param") && j["error"].contains("code"));
  };
  expect_error(c.request("POST", "/v1/chat/completions", "{bad json"), 400, "malformed");
  expect_error(c.request("POST", "/v1/chat/completions", "{\"model\": \"test-model\", \"messages\": ["), 400,
               "truncated");
  expect_error(c.request("POST", "/v1/chat/completions", ""), 400, "empty body");
  expect_error(c.request("POST", "/v1/chat/completions",
                         "{\"model\":\"test-model\",\"messages\":[{\"role\":\"user\","
                         "\"content\":\"\\ud800\"}]}"),
               400, "lone surrogate");
  expect_error(c.request("POST", "/v1/chat/completions",
                         "{\"model\":\"test-model\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}"),
               400, "invalid utf-8");
  expect_error(c.request("POST", "/v1/chat/completions", chat_body({{"model", "other"}})), 404, "unknown model");
  expect_error(c.request("POST", "/v1/chat/completions", chat_body({{"temperature", -1}})), 400, "range");
  expect_error(c.request("POST", "/v1/chat/completions", chat_body({{"bogus", 1}})), 400, "unknown field");
  expect_error(c.request("POST", "/v1/nope", "{}"), 404, "unknown route");
  Reply m = c.request("GET", "/v1/chat/completions");
  expect_error(m, 405, "method");
  EXPECT_EQ(m.headers["allow"], "POST");
  // Prompt longer than the context (512 tokens in the fake).
  std::string longp(600, 'x');
  Reply l = c.request("POST", "/v1/completions", json{{"model", "test-model"}, {"prompt", longp}}.dump());
  expect_error(l, 400, "context");
  EXPECT_NE(l.json_body()["error"]["message"].get<std::string>().find("600"), std::string::npos);
  Reply l2 = c.request("POST", "/v1/completions",
                       json{{"model", "test-model"}, {"prompt", "abc"}, {"max_tokens", 510}}.dump());
  expect_error(l2, 400, "context + max_tokens");
  // The connection still serves a normal request afterwards.
  EXPECT_EQ(c.request("POST", "/v1/chat/completions", chat_body()).status, 200);
  EXPECT_GE(service_->metrics()->http_count(400), 8);
}

TEST_F(ServerTest, ApiKey) {
  ServiceOptions so;
  so.api_key = "sekret";
  start(so);
  Client c(port_);
  Reply none = c.request("POST", "/v1/chat/completions", chat_body());
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.json_body()["error"]["code"], "invalid_api_key");
  EXPECT_EQ(c.request("POST", "/v1/chat/completions", chat_body(), {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(c.request("GET", "/v1/models", "", {{"Authorization", "Bearer sekret"}}).status, 200);
  EXPECT_EQ(c.request("POST", "/v1/chat/completions", chat_body(), {{"Authorization", "Bearer sekret"}}).status, 200);
  EXPECT_EQ(c.request("GET", "/health").status, 200);  // probes stay open
}

TEST_F(ServerTest, BodyLimit413) {
  HttpServerOptions ho;
  ho.max_body_bytes = 1000;
  auto reported = std::make_shared<std::atomic<int>>(0);
  ho.on_transport_error = [reported](int status) { reported->store(status); };
  start({}, ho);
  Client c(port_);
  Reply r = c.request("POST", "/v1/completions", std::string(5000, 'x'));
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.json_body()["error"]["code"], "payload_too_large");
  EXPECT_EQ(reported->load(), 413);  // the transport's own errors reach the metrics hook
  Client c2(port_);
  EXPECT_EQ(c2.request("GET", "/health").status, 200);
}

TEST_F(ServerTest, SlowClientGets408) {
  HttpServerOptions ho;
  ho.request_timeout = std::chrono::milliseconds(300);
  auto reported = std::make_shared<std::atomic<int>>(0);
  ho.on_transport_error = [reported](int status) { reported->store(status); };
  start({}, ho);
  Client c(port_);
  c.send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mo");
  Reply r = c.read();
  EXPECT_EQ(r.status, 408);
  EXPECT_EQ(reported->load(), 408);
  Client c2(port_);
  EXPECT_EQ(c2.request("GET", "/health").status, 200);
}

TEST_F(ServerTest, KeepAliveAndPipelining) {
  start();
  Client c(port_);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.request("GET", "/health").status, 200);
  c.send_raw("GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /ready HTTP/1.1\r\nHost: x\r\n\r\n");
  Reply p1 = c.read();
  Reply p2 = c.read();
  EXPECT_EQ(p1.status, 200);
  EXPECT_EQ(p1.body, "{\"status\":\"ok\"}");
  EXPECT_EQ(p2.status, 200);
  EXPECT_EQ(p2.body, "{\"status\":\"ready\"}");
  EXPECT_EQ(server_->counters().accepted_connections, 1);
  Client c3(port_);
  EXPECT_EQ(c3.request("GET", "/health").status, 200);
  c3.send_raw("GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /ready HTTP/1.1\r\nHost: x\r\n\r\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  c3.send_raw("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string raw = c3.read_until("never appears");
  // The status line, not any "408" inside a random X-Request-Id.
  EXPECT_EQ(raw.find("HTTP/1.1 408"), std::string::npos) << raw;
  size_t count = 0;
  for (size_t p = 0; (p = raw.find("HTTP/1.1 ", p)) != std::string::npos; ++p) ++count;
  EXPECT_EQ(count, 3u) << raw;
  Reply close = c.request("GET", "/health", "", {{"Connection", "close"}});
  EXPECT_EQ(close.headers["connection"], "close");
  EXPECT_TRUE(c.closed_by_peer());
}

TEST_F(ServerTest, Cors) {
  HttpServerOptions ho;
  ho.cors_origins = {"http://app.example"};
  start({}, ho);
  Client c(port_);
  Reply pre = c.request("OPTIONS", "/v1/chat/completions", "", {{"Origin", "http://app.example"}});
  EXPECT_EQ(pre.status, 204);
  EXPECT_EQ(pre.headers["access-control-allow-origin"], "http://app.example");
  EXPECT_NE(pre.headers["access-control-allow-headers"].find("Authorization"), std::string::npos);
  Reply other = c.request("GET", "/health", "", {{"Origin", "http://evil.example"}});
  EXPECT_EQ(other.headers.count("access-control-allow-origin"), 0u);
}

TEST_F(ServerTest, DisconnectMidStreamCancels) {
  start();
  backend_->step = std::chrono::milliseconds(10);
  backend_->max_model_len = 100000;
  Client c(port_);
  c.send("POST", "/v1/chat/completions", chat_body({{"stream", true}, {"ignore_eos", true}, {"max_tokens", 5000}}));
  std::string got = c.read_until("\"content\":\"o\"");
  EXPECT_NE(got.find("chat.completion.chunk"), std::string::npos);
  EXPECT_EQ(service_->num_inflight(), 1);
  c.close();
  EXPECT_TRUE(wait_for([&] { return backend_->num_cancelled == 1; }));
  EXPECT_TRUE(wait_for([&] { return service_->num_inflight() == 0; }));
  EXPECT_TRUE(wait_for([&] { return backend_->stats().num_running == 0; }));
}

TEST_F(ServerTest, DisconnectWhileWaitingNonStreamingCancels) {
  start();
  backend_->step = std::chrono::milliseconds(10);
  backend_->max_model_len = 100000;
  Client c(port_);
  c.send("POST", "/v1/chat/completions", chat_body({{"ignore_eos", true}, {"max_tokens", 5000}}));
  EXPECT_TRUE(wait_for([&] { return service_->num_inflight() == 1; }));
  c.close();
  EXPECT_TRUE(wait_for([&] { return backend_->num_cancelled == 1; }));
  EXPECT_TRUE(wait_for([&] { return service_->num_inflight() == 0; }));
}

TEST_F(ServerTest, QueueFull429) {
  ServiceOptions so;
  so.max_queue = 1;
  start(so);
  backend_->first_output_delay = std::chrono::milliseconds(500);  // the first output comes late
  Client a(port_), b(port_);
  a.send("POST", "/v1/chat/completions", chat_body({{"max_tokens", 1}}));
  EXPECT_TRUE(wait_for([&] { return service_->num_inflight() == 1; }));
  Reply r = b.request("POST", "/v1/chat/completions", chat_body({{"max_tokens", 1}}));
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_EQ(a.read().status, 200);
}

TEST_F(ServerTest, DrainAndAbort) {
  start();
  backend_->step = std::chrono::milliseconds(10);
  backend_->max_model_len = 100000;
  Client streaming(port_), idle(port_);
  EXPECT_EQ(idle.request("GET", "/health").status, 200);
  streaming.send("POST", "/v1/chat/completions",
                 chat_body({{"stream", true}, {"ignore_eos", true}, {"max_tokens", 5000}}));
  EXPECT_TRUE(wait_for([&] { return service_->num_inflight() == 1; }));
  server_->begin_drain();
  service_->begin_drain();
  EXPECT_TRUE(idle.closed_by_peer());  // idle keep-alive connections are closed
  EXPECT_EQ(service_->num_inflight(), 1);
  service_->abort_all();
  Reply r = streaming.read();
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"finish_reason\":\"abort\""), std::string::npos);
  EXPECT_NE(r.body.find("data: [DONE]"), std::string::npos);
  // Its head went out before the drain (keep-alive), but the connection closes after it.
  EXPECT_TRUE(streaming.closed_by_peer());
  EXPECT_TRUE(wait_for([&] { return service_->num_inflight() == 0; }));
  // New connections are refused once draining.
  bool refused = false;
  try {
    Client late(port_);
    refused = late.request("GET", "/health").status == 0;
  } catch (const std::exception&) {
    refused = true;
  }
  EXPECT_TRUE(refused);
}

TEST_F(ServerTest, ManyConcurrentStreams) {
  start();
  constexpr int kClients = 64;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Client c(port_);
      Reply r = c.request("POST", "/v1/chat/completions", chat_body({{"stream", i % 2 == 0}, {"max_tokens", 5}}));
      if (r.status != 200) return;
      if (i % 2 == 0) {
        std::string text;
        for (const std::string& e : sse_payloads(r.body)) {
          if (e == "[DONE]") continue;
          json j = json::parse(e);
          if (j["choices"][0]["delta"].contains("content")) text += j["choices"][0]["delta"]["content"];
        }
        if (text == "ok ok") ++ok;
      } else if (r.json_body()["choices"][0]["message"]["content"] == "ok ok") {
        ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, kClients);
  EXPECT_TRUE(wait_for([&] { return service_->num_inflight() == 0; }));
}

}  // namespace
}  // namespace osprey::server
namespace osprey::server {
namespace {
TEST_F(ServerTest, ConnectionCloseIsHonoured) {
  start();
  Client c(port_);
  c.send_raw("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  Reply r = c.read();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["connection"], "close");
  EXPECT_TRUE(c.closed_by_peer());
  Client d(port_);
  d.send_raw("GET /health HTTP/1.0\r\n\r\n");
  Reply r2 = d.read();
  EXPECT_EQ(r2.status, 200);
  EXPECT_EQ(r2.headers["connection"], "close");
}
}  // namespace
}  // namespace osprey::server
namespace osprey::server {
namespace {
TEST_F(ServerTest, PipelinedRequestsAnsweredOnce) {
  start();
  Client c(port_);
  c.send_raw("GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string all = c.read_until("never appears");  // reads to EOF
  size_t count = 0;
  for (size_t p = 0; (p = all.find("HTTP/1.1 ", p)) != std::string::npos; ++p) ++count;
  EXPECT_EQ(count, 2u) << all;
  EXPECT_NE(all.find("\"ok\""), std::string::npos);
  EXPECT_NE(all.find("\"ready\""), std::string::npos);
}

// --- tool calls -------------------------------------------------------------

const char* kWeatherCall = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";

json weather_tools() {
  return json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
}

ServiceOptions with_parser(const std::string& name) {
  ServiceOptions so;
  so.tool_call_parser = name;
  return so;
}

TEST_F(ServerTest, ToolCallsNonStreaming) {
  start(with_parser("hermes"), {}, [](FakeBackend& b) {
    b.reply = std::string("Checking. ") + kWeatherCall;
    b.reply_repeats = 1;
  });
  EXPECT_EQ(service_->tool_parser(), ToolParserKind::kHermes);
  Client c(port_);
  Reply r = c.request("POST", "/v1/chat/completions", chat_body({{"tools", weather_tools()}}));
  ASSERT_EQ(r.status, 200) << r.body;
  json ch = r.json_body()["choices"][0];
  EXPECT_EQ(ch["finish_reason"], "tool_calls");
  EXPECT_EQ(ch["message"]["content"], "Checking.");
  ASSERT_EQ(ch["message"]["tool_calls"].size(), 1u) << r.body;
  json call = ch["message"]["tool_calls"][0];
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["function"]["arguments"], "{\"city\":\"Paris\",\"unit\":\"c\"}");

  // Only a call: content is null.
  backend_->reply = kWeatherCall;
  r = c.request("POST", "/v1/chat/completions", chat_body({{"tools", weather_tools()}, {"tool_choice", "auto"}}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(r.json_body()["choices"][0]["message"]["content"].is_null()) << r.body;
  EXPECT_EQ(r.json_body()["choices"][0]["finish_reason"], "tool_calls");
}

TEST_F(ServerTest, ToolCallsStreamingNeverLeakMarkup) {
  start(with_parser("hermes"), {}, [](FakeBackend& b) {
    b.reply = std::string("Hi <b>there</b>. ") + kWeatherCall + kWeatherCall;
    b.reply_repeats = 1;
  });
  Client c(port_);
  c.send("POST", "/v1/chat/completions", chat_body({{"tools", weather_tools()}, {"stream", true}, {"n", 2}}));
  Reply r = c.read();
  ASSERT_EQ(r.status, 200) << r.body;
  auto events = sse_payloads(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::map<int, std::string> content;
  std::map<int, std::vector<json>> calls;  // per choice: call deltas in order
  std::map<int, std::string> finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json j = json::parse(events[i]);
    for (const json& choice : j["choices"]) {
      const int idx = choice["index"];
      const json& d = choice["delta"];
      if (d.contains("content")) content[idx] += d["content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const json& tc : d["tool_calls"]) calls[idx].push_back(tc);
      if (!choice["finish_reason"].is_null()) finish[idx] = choice["finish_reason"];
    }
  }
  for (int idx = 0; idx < 2; ++idx) {
    EXPECT_EQ(content[idx], "Hi <b>there</b>.") << idx;
    EXPECT_EQ(finish[idx], "tool_calls") << idx;
    ASSERT_EQ(calls[idx].size(), 4u) << idx;  // two calls x (name, arguments)
    for (int k = 0; k < 2; ++k) {
      const json& head = calls[idx][2 * k];
      const json& args = calls[idx][2 * k + 1];
      EXPECT_EQ(head["index"], k);
      EXPECT_EQ(head["type"], "function");
      EXPECT_EQ(head["id"].get<std::string>().rfind("call_", 0), 0u);
      EXPECT_EQ(head["function"]["name"], "get_weather");
      EXPECT_EQ(args["index"], k);
      EXPECT_FALSE(args.contains("id"));
      EXPECT_EQ(args["function"]["arguments"], "{\"city\":\"Paris\",\"unit\":\"c\"}");
    }
    EXPECT_NE(calls[idx][0]["id"], calls[idx][2]["id"]);
  }
  EXPECT_EQ(r.body.find("tool_call>"), std::string::npos);
}

TEST_F(ServerTest, ToolOutputLeftAloneWithoutToolsOrWithChoiceNone) {
  start(with_parser("hermes"), {}, [](FakeBackend& b) {
    b.reply = kWeatherCall;
    b.reply_repeats = 1;
  });
  Client c(port_);
  for (json extra : {json::object(), json{{"tools", weather_tools()}, {"tool_choice", "none"}}}) {
    Reply r = c.request("POST", "/v1/chat/completions", chat_body(extra));
    ASSERT_EQ(r.status, 200) << r.body;
    json ch = r.json_body()["choices"][0];
    EXPECT_EQ(ch["message"]["content"], kWeatherCall);
    EXPECT_TRUE(ch["message"]["tool_calls"].empty());
    EXPECT_EQ(ch["finish_reason"], "stop");
  }
}

TEST_F(ServerTest, MalformedToolCallStaysContent) {
  const std::string bad = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": </tool_call>";
  start(with_parser("hermes"), {}, [&](FakeBackend& b) {
    b.reply = bad;
    b.reply_repeats = 1;
  });
  Client c(port_);
  for (bool stream : {false, true}) {
    Reply r = c.request("POST", "/v1/chat/completions", chat_body({{"tools", weather_tools()}, {"stream", stream}}));
    ASSERT_EQ(r.status, 200) << r.body;
    if (!stream) {
      EXPECT_EQ(r.json_body()["choices"][0]["message"]["content"], bad);
      EXPECT_EQ(r.json_body()["choices"][0]["finish_reason"], "stop");
    } else {
      std::string text;
      for (const std::string& e : sse_payloads(r.body)) {
        if (e == "[DONE]") break;
        const json j = json::parse(e);
        for (const json& ch : j["choices"]) {
          if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
          EXPECT_FALSE(ch["delta"].contains("tool_calls"));
        }
      }
      EXPECT_EQ(text, bad) << r.body;
    }
  }
}

TEST_F(ServerTest, ToolParserAutoFromTheTemplate) {
  start(with_parser("auto"), {}, [](FakeBackend& b) { b.template_source = "{{ '<tool_call>' }}"; });
  EXPECT_EQ(service_->tool_parser(), ToolParserKind::kHermes);
  TearDown();
  start(with_parser("auto"));  // a template without tool markup
  EXPECT_EQ(service_->tool_parser(), ToolParserKind::kNone);
  TearDown();
  start(with_parser("mistral"));
  EXPECT_EQ(service_->tool_parser(), ToolParserKind::kMistral);
}

TEST_F(ServerTest, ToolChoiceRequiredOrNamedIs400) {
  start(with_parser("hermes"));
  Client c(port_);
  for (json choice : {json("required"), json{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}) {
    Reply r = c.request("POST", "/v1/chat/completions", chat_body({{"tools", weather_tools()}, {"tool_choice", choice}}));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.json_body()["error"]["param"], "tool_choice");
    EXPECT_NE(r.json_body()["error"]["message"].get<std::string>().find("constrained decoding"), std::string::npos);
  }
  EXPECT_EQ(c.request("POST", "/v1/chat/completions", chat_body()).status, 200);
}

TEST_F(ServerTest, ToolHistoryMessagesAccepted) {
  start(with_parser("hermes"));
  Client c(port_);
  json messages = json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}])");
  Reply r = c.request("POST", "/v1/chat/completions", chat_body({{"messages", messages}, {"tools", weather_tools()}}));
  EXPECT_EQ(r.status, 200) << r.body;
  messages[1]["tool_calls"][0]["function"].erase("name");
  r = c.request("POST", "/v1/chat/completions", chat_body({{"messages", messages}}));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.json_body()["error"]["param"], "messages[1].tool_calls[0].function.name");
}

TEST_F(ServerTest, QueueTimeComesFromTheEngine) {
  start();
  Client c(port_);
  ASSERT_EQ(c.request("POST", "/v1/chat/completions", chat_body({{"n", 3}})).status, 200);
  ASSERT_EQ(c.request("POST", "/v1/completions", R"({"model": "test-model", "prompt": ["a", "b"]})").status, 200);
  Reply m = c.request("GET", "/metrics");
  // One observation per engine request (1 chat + 2 prompts), each the engine's 0.25 s.
  EXPECT_NE(m.body.find("osprey:request_queue_time_seconds_count{model_name=\"test-model\"} 3\n"), std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("osprey:request_queue_time_seconds_sum{model_name=\"test-model\"} 0.75\n"), std::string::npos)
      << m.body;
}
}  // namespace
}  // namespace osprey::server
