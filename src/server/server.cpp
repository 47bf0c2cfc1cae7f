#include "server/server.h"

#include <spdlog/spdlog.h>

#include <sys/resource.h>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>

#include "server/openai_service.h"
#include "server/tool_parser.h"

namespace osprey::server {

std::vector<std::string> model_names(const std::string& model_arg, const std::string& resolved_path,
                                     const std::vector<std::string>& served) {
  std::vector<std::string> names;
  for (const std::string& s : served)
    if (!s.empty()) names.push_back(s);
  if (names.empty()) {
    std::string p = resolved_path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    std::string base = p.substr(p.find_last_of('/') == std::string::npos ? 0 : p.find_last_of('/') + 1);
    if (base.size() > 5 && base.substr(base.size() - 5) == ".gguf") base.resize(base.size() - 5);
    names.push_back(base.empty() ? model_arg : base);
  }
  auto add = [&](const std::string& n) {
    if (!n.empty() && std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  };
  add(model_arg);
  add(resolved_path);
  return names;
}

namespace {

// Every connection holds a file descriptor: raise the soft RLIMIT_NOFILE to
// the hard limit so that thousands of connections do not hit a low default
// (often 1024). Logs what it got; failure is not fatal.
void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t before = lim.rlim_cur;
  if (lim.rlim_cur != lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      spdlog::warn("cannot raise the open-file limit from {} to {}", before, lim.rlim_max);
      return;
    }
  }
  if (lim.rlim_cur == RLIM_INFINITY)
    spdlog::info("open-file limit: unlimited");
  else
    spdlog::info("open-file limit: {} (was {})", lim.rlim_cur, before);
}

// One greedy token through the whole engine: proves it can generate.
Status warm_up(GenerationBackend& backend) {
  Request r;
  r.request_id = "osprey-warmup";
  r.prompt_token_ids = backend.encode("Hello", false);
  if (r.prompt_token_ids.empty()) r.prompt_token_ids.push_back(0);
  r.params.max_tokens = 1;
  r.params.temperature = 0.0f;
  auto stream = backend.submit(std::move(r), nullptr);
  if (!stream.ok()) return stream.status();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (std::chrono::steady_clock::now() < deadline) {
    auto out = (*stream)->next_for(std::chrono::milliseconds(200));
    if (out && out->finished) {
      if (!out->error.ok()) return out->error;
      return Status::Ok();
    }
    if (!out && (*stream)->done()) return Status::Ok();
  }
  (*stream)->cancel();
  return Status(StatusCode::kUnavailable, "warm-up generation did not finish in 5 minutes");
}

}  // namespace

int run_server(const ServerConfig& config, BackendFactory factory) {
  std::signal(SIGPIPE, SIG_IGN);
  raise_fd_limit();
  std::string chat_template;
  if (!config.chat_template_path.empty()) {
    std::ifstream f(config.chat_template_path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    if (!f || ss.str().empty()) {
      spdlog::error("cannot read the chat template file '{}'", config.chat_template_path);
      return 1;
    }
    chat_template = ss.str();
  }
  if (config.tool_call_parser != "auto" && !tool_parser_from_name(config.tool_call_parser)) {
    spdlog::error("unknown tool-call parser '{}' (auto, hermes, llama3_json, mistral, none)", config.tool_call_parser);
    return 1;
  }
  ServiceOptions so;
  so.tool_call_parser = config.tool_call_parser;
  so.model_names = model_names(config.model_arg, config.engine.model_path, config.served_model_names);
  so.model_root = config.engine.model_path;
  so.api_key = config.api_key;
  so.max_queue = config.max_queue;
  auto service = std::make_shared<OpenAIService>(so);
  HttpServerOptions http_options = config.http;
  http_options.on_transport_error = [metrics = service->metrics()](int status) { metrics->count_http(status); };
  HttpServer http(std::move(http_options), [service](HttpRequest req, std::shared_ptr<ResponseWriter> w) {
    service->handle(std::move(req), std::move(w));
  });
  service->set_connection_counter([&http] { return http.counters().open_connections; });

  boost::asio::io_context main_ioc;
  boost::asio::signal_set signals(main_ioc, SIGINT, SIGTERM);
  std::atomic<int> num_signals{0};
  std::function<void()> wait_signal = [&] {
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      ++num_signals;
      spdlog::info("received signal {}", sig);
      wait_signal();
    });
  };
  wait_signal();

  if (Status s = http.start(); !s.ok()) {
    spdlog::error("{}", s.to_string());
    return 1;
  }
  spdlog::info("osprey serve: listening on http://{}:{} (model names: {})", config.http.host, http.port(),
               so.model_names[0]);

  std::atomic<bool> load_done{false};
  std::atomic<bool> load_failed{false};
  std::shared_ptr<GenerationBackend> backend;
  std::thread loader([&] {
    auto b = factory(config.engine);
    if (!b.ok()) {
      spdlog::error("cannot load the model: {}", b.status().to_string());
      service->set_not_ready_reason("failed: " + b.status().message());
      load_failed = true;
      load_done = true;
      return;
    }
    backend = std::shared_ptr<GenerationBackend>(std::move(*b));
    if (!chat_template.empty()) {
      if (Status s = backend->set_chat_template(chat_template); !s.ok()) {
        spdlog::error("--chat-template {}: {}", config.chat_template_path, s.message());
        service->set_not_ready_reason("failed: " + s.message());
        load_failed = true;
        load_done = true;
        return;
      }
      spdlog::info("chat template: {}", config.chat_template_path);
    }
    service->set_backend(backend);
    if (config.warmup) {
      service->set_not_ready_reason("warming up");
      if (Status s = warm_up(*backend); !s.ok()) {
        spdlog::error("the engine cannot generate: {}", s.to_string());
        service->set_not_ready_reason("failed: " + s.message());
        load_done = true;
        return;
      }
    }
    service->set_ready(true);
    const ModelInfo info = backend->model_info();
    spdlog::info("ready: {} (context {} tokens, {} KV pages of {} tokens)", info.model_path, info.max_model_len,
                 info.num_kv_blocks, info.block_size);
    load_done = true;
  });

  // Wait for a signal (or a failed load).
  while (num_signals == 0 && !load_failed) {
    main_ioc.run_for(std::chrono::milliseconds(50));
  }
  int code = 0;
  if (load_failed) code = 1;
  if (num_signals > 0)
    spdlog::info("shutting down: draining in-flight requests for up to {} s", config.shutdown_timeout_s);
  http.begin_drain();
  service->begin_drain();
  loader.join();

  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(config.shutdown_timeout_s * 1000));
  while (service->num_inflight() > 0 && Clock::now() < deadline && num_signals < 2)
    main_ioc.run_for(std::chrono::milliseconds(20));
  if (service->num_inflight() > 0) {
    spdlog::warn("aborting {} requests still in flight", service->num_inflight());
    service->abort_all();
    const auto abort_deadline = Clock::now() + std::chrono::seconds(5);
    while (service->num_inflight() > 0 && Clock::now() < abort_deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Let the last responses reach their clients (connections close after them).
  const auto flush_deadline = Clock::now() + std::chrono::seconds(3);
  while (http.counters().open_connections > 0 && Clock::now() < flush_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http.stop();
  if (backend) backend->shutdown();
  spdlog::info("osprey serve: stopped");
  return code;
}

}  // namespace osprey::server
