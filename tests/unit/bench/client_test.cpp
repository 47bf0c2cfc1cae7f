// The streaming client against in-test servers that answer, fail, disconnect
// mid-stream, stall and send garbage: every request must end with the right
// record, and a stalled one must time out instead of hanging.
#include "bench/stream_client.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "bench/mock_server.h"
#include "bench/serve_runner.h"

namespace osprey::bench {
namespace {

struct Result {
  RequestRecord record;
  std::string text;
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<MockServer>(MockServerOptions{});
    ASSERT_TRUE(server_->start().ok());
  }

  std::unique_ptr<StreamClient> client(const std::string& path = "/v1/completions", double timeout_s = 10,
                                       int port = -1) {
    ClientOptions o;
    o.url = *parse_base_url("http://127.0.0.1:" + std::to_string(port < 0 ? server_->port() : port));
    o.path = path;
    o.timeout_s = timeout_s;
    o.api_key = "secret";
    auto c = StreamClient::create(o);
    EXPECT_TRUE(c.ok());
    return std::move(c).value();
  }

  static Result send(StreamClient& c, const std::string& model, int max_tokens, bool chat = false) {
    nlohmann::json body = {{"model", model}, {"max_tokens", max_tokens}, {"stream", true}};
    if (chat)
      body["messages"] = {{{"role", "user"}, {"content", "a b c"}}};
    else
      body["prompt"] = "one two three four";
    RequestRecord r;
    r.expected_output_tokens = max_tokens;
    r.prompt_tokens = -1;
    std::promise<Result> p;
    auto f = p.get_future();
    c.send(body.dump(), r, true, [&p](RequestRecord&& rec, std::string&& text) { p.set_value({std::move(rec), std::move(text)}); });
    EXPECT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "request hung";
    return f.get();
  }

  std::unique_ptr<MockServer> server_;
};

TEST_F(ClientTest, NormalStreamWithUsage) {
  auto c = client();
  Result r = send(*c, "mock", 25);
  ASSERT_TRUE(r.record.ok()) << r.record.error_message;
  EXPECT_EQ(r.record.http_status, 200);
  EXPECT_TRUE(r.record.usage_reported);
  EXPECT_EQ(r.record.output_tokens, 25);
  EXPECT_EQ(r.record.prompt_tokens, 4);  // the mock counts words
  EXPECT_EQ(r.record.chunk_s.size(), 25u);
  EXPECT_GE(r.record.first_token_s, r.record.send_s);
  EXPECT_GE(r.record.end_s, r.record.chunk_s.back());
  for (size_t i = 1; i < r.record.chunk_s.size(); ++i) EXPECT_LE(r.record.chunk_s[i - 1], r.record.chunk_s[i]);
  std::string want;
  for (int i = 0; i < 25; ++i) want += " tok";
  EXPECT_EQ(r.text, want);
}

TEST_F(ClientTest, ChatEndpoint) {
  auto c = client("/v1/chat/completions");
  Result r = send(*c, "mock", 7, true);
  ASSERT_TRUE(r.record.ok()) << r.record.error_message;
  EXPECT_EQ(r.record.output_tokens, 7);
  EXPECT_EQ(r.record.chunk_s.size(), 7u);
}

TEST_F(ClientTest, NoUsageFallsBackToCountingChunks) {
  auto c = client();
  Result r = send(*c, "nousage", 9);
  ASSERT_TRUE(r.record.ok()) << r.record.error_message;
  EXPECT_FALSE(r.record.usage_reported);
  EXPECT_EQ(r.record.output_tokens, 9);
  EXPECT_EQ(r.record.prompt_tokens, -1);  // left as the caller set it
}

TEST_F(ClientTest, HttpError) {
  auto c = client();
  Result r = send(*c, "fail-503", 5);
  EXPECT_EQ(r.record.error, ErrorKind::kHttpStatus);
  EXPECT_EQ(r.record.http_status, 503);
  EXPECT_NE(r.record.error_message.find("mock failure"), std::string::npos) << r.record.error_message;
  EXPECT_TRUE(r.record.chunk_s.empty());
}

TEST_F(ClientTest, DisconnectMidStream) {
  auto c = client();
  Result r = send(*c, "disconnect-3", 10);
  EXPECT_EQ(r.record.error, ErrorKind::kDisconnect) << r.record.error_message;
  EXPECT_EQ(r.record.chunk_s.size(), 3u);
}

TEST_F(ClientTest, StallTimesOut) {
  auto c = client("/v1/completions", 1.0);
  Result r = send(*c, "stall-2", 10);
  EXPECT_EQ(r.record.error, ErrorKind::kTimeout) << r.record.error_message;
  EXPECT_EQ(r.record.chunk_s.size(), 2u);
}

TEST_F(ClientTest, MalformedEvent) {
  auto c = client();
  Result r = send(*c, "malformed", 10);
  EXPECT_EQ(r.record.error, ErrorKind::kMalformed) << r.record.error_message;
}

TEST_F(ClientTest, StreamWithoutDone) {
  auto c = client();
  Result r = send(*c, "nodone", 4);
  EXPECT_EQ(r.record.error, ErrorKind::kDisconnect) << r.record.error_message;
  EXPECT_EQ(r.record.chunk_s.size(), 4u);
}

TEST_F(ClientTest, ServerThatLingersAfterDoneStillSucceeds) {
  // The response never ends after [DONE]: the client waits a grace period
  // (min(2 s, the timeout)), then keeps the request as complete, its end
  // being the [DONE] event (which came before the deadline), not the close.
  auto c = client("/v1/completions", 1.0);
  Result r = send(*c, "linger", 6);
  ASSERT_TRUE(r.record.ok()) << r.record.error_message;
  EXPECT_EQ(r.record.output_tokens, 6);
  EXPECT_LT(r.record.end_s - r.record.send_s, 1.0);
}

TEST_F(ClientTest, ConnectFailure) {
  // A port nobody listens on: bind one, close it.
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::acceptor a(ioc, {boost::asio::ip::make_address("127.0.0.1"), 0});
  const int port = a.local_endpoint().port();
  a.close();
  auto c = client("/v1/completions", 5, port);
  Result r = send(*c, "mock", 3);
  EXPECT_EQ(r.record.error, ErrorKind::kConnect) << r.record.error_message;
}

// A raw server that accepts, reads the request and then either says nothing
// (the client must time out) or closes at once (disconnect before a response).
TEST(RawServer, SilentAndClosingServers) {
  for (bool close_at_once : {false, true}) {
    boost::asio::io_context ioc;
    boost::asio::ip::tcp::acceptor a(ioc, {boost::asio::ip::make_address("127.0.0.1"), 0});
    const int port = a.local_endpoint().port();
    std::thread server([&] {
      boost::asio::ip::tcp::socket s(ioc);
      a.accept(s);
      char buf[4096];
      boost::system::error_code ec;
      s.read_some(boost::asio::buffer(buf), ec);
      if (close_at_once) {
        s.close(ec);
        return;
      }
      s.read_some(boost::asio::buffer(buf), ec);  // until the client gives up and closes
    });
    ClientOptions o;
    o.url = *parse_base_url("http://127.0.0.1:" + std::to_string(port));
    o.timeout_s = 0.3;
    auto c = StreamClient::create(o);
    ASSERT_TRUE(c.ok());
    std::promise<RequestRecord> p;
    auto f = p.get_future();
    (*c)->send("{\"model\":\"x\"}", RequestRecord{}, false,
               [&p](RequestRecord&& r, std::string&&) { p.set_value(std::move(r)); });
    ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    const RequestRecord r = f.get();
    EXPECT_EQ(r.error, close_at_once ? ErrorKind::kDisconnect : ErrorKind::kTimeout) << r.error_message;
    server.join();
  }
}

TEST_F(ClientTest, ManyConcurrentStreamsThroughTheRunner) {
  auto c = client();
  ServeOptions o;
  o.model = "mock";
  std::vector<Conversation> convs(300);
  for (auto& conv : convs) {
    Turn t;
    t.token_ids = {1, 2, 3};
    t.input_tokens = 3;
    t.output_tokens = 20;
    conv.turns.push_back(t);
  }
  std::vector<double> at(convs.size(), 0.0);
  auto recs = run_conversations(*c, o, convs, at, /*max_concurrency=*/0, "test");
  ASSERT_EQ(recs.size(), 300u);
  const RunMetrics m = compute_metrics(recs, Slo{});
  EXPECT_EQ(m.num_ok, 300) << (m.errors.empty() ? "" : m.errors.begin()->first);
  EXPECT_EQ(m.total_output_tokens, 300 * 20);
  EXPECT_EQ(m.num_output_mismatch, 0);
  EXPECT_EQ(m.itl_s.count, 300 * 19);
}

TEST_F(ClientTest, MultiTurnConversationsCarryTheAnswers) {
  auto c = client("/v1/chat/completions");
  ServeOptions o;
  o.model = "mock";
  o.endpoint = "/v1/chat/completions";
  std::vector<Conversation> convs(4);
  for (auto& conv : convs)
    for (int k = 0; k < 3; ++k) {
      Turn t;
      t.text = "w" + std::to_string(k);
      t.input_tokens = 1;
      t.output_tokens = 5;
      conv.turns.push_back(t);
    }
  std::vector<double> at = {0, 0, 0.01, 0.02};
  auto recs = run_conversations(*c, o, convs, at, /*max_concurrency=*/2, "test");
  ASSERT_EQ(recs.size(), 12u);
  // The mock counts the words of every message: turn k sends k earlier user
  // words, k answers of 5 words, and its own word.
  std::map<int, int> prompts;
  for (const auto& r : recs) {
    ASSERT_TRUE(r.ok()) << r.error_message;
    ++prompts[r.prompt_tokens];
  }
  EXPECT_EQ(prompts[1], 4);
  EXPECT_EQ(prompts[7], 4);
  EXPECT_EQ(prompts[13], 4);
  // The body of turn 2 holds the whole history.
  const auto body = request_body(o, convs[0], 2, {"a1", "a2"});
  ASSERT_EQ(body["messages"].size(), 5u);
  EXPECT_EQ(body["messages"][1]["content"], "a1");
  EXPECT_EQ(body["messages"][4]["content"], "w2");
  EXPECT_EQ(body["max_tokens"], 5);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
}

TEST(BaseUrl, Parsing) {
  auto u = parse_base_url("http://localhost:8000/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "localhost");
  EXPECT_EQ(u->port, "8000");
  EXPECT_EQ(u->prefix, "");
  u = parse_base_url("127.0.0.1:9/api/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->prefix, "/api");
  u = parse_base_url("http://[::1]:8080");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, "8080");
  EXPECT_EQ(parse_base_url("http://example.com")->port, "80");
  EXPECT_FALSE(parse_base_url("https://x").ok());
  EXPECT_FALSE(parse_base_url("http://:80").ok());
  EXPECT_FALSE(parse_base_url("http://h:8x").ok());
  EXPECT_FALSE(parse_base_url("").ok());
}

}  // namespace
}  // namespace osprey::bench
