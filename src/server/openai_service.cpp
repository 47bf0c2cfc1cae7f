#include "server/openai_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "server/json_util.h"

namespace osprey::server {

using json = nlohmann::ordered_json;

namespace {

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned diff = a.size() != b.size();
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

struct RouteInfo {
  const char* path;
  const char* method;
};
constexpr RouteInfo kRoutes[] = {
    {"/health", "GET"},
    {"/ready", "GET"},
    {"/metrics", "GET"},
    {"/v1/models", "GET"},
    {"/v1/chat/completions", "POST"},
    {"/v1/completions", "POST"},
    {"/tokenize", "POST"},
    {"/detokenize", "POST"},
};

}  // namespace

OpenAIService::OpenAIService(ServiceOptions options)
    : options_(std::move(options)),
      metrics_(std::make_shared<ServerMetrics>(options_.model_names.empty() ? "" : options_.model_names[0])),
      created_(unix_time_s()) {}

void OpenAIService::set_backend(std::shared_ptr<GenerationBackend> backend) {
  ToolParserKind parser = ToolParserKind::kNone;
  if (options_.tool_call_parser == "auto") {
    if (backend) parser = detect_tool_parser(backend->chat_template_source());
    spdlog::info("tool-call parser: {} (auto: from the chat template)", tool_parser_name(parser));
  } else {
    parser = tool_parser_from_name(options_.tool_call_parser).value_or(ToolParserKind::kNone);
    spdlog::info("tool-call parser: {}", tool_parser_name(parser));
  }
  std::lock_guard lock(mu_);
  backend_ = std::move(backend);
  tool_parser_ = parser;
}

ToolParserKind OpenAIService::tool_parser() const {
  std::lock_guard lock(mu_);
  return tool_parser_;
}

std::shared_ptr<GenerationBackend> OpenAIService::backend() const {
  std::lock_guard lock(mu_);
  return backend_;
}

void OpenAIService::set_ready(bool ready) {
  ready_ = ready;
}
bool OpenAIService::ready() const {
  return ready_ && !draining_;
}

void OpenAIService::set_not_ready_reason(std::string reason) {
  std::lock_guard lock(mu_);
  not_ready_reason_ = std::move(reason);
}

void OpenAIService::set_connection_counter(std::function<int64_t()> f) {
  std::lock_guard lock(mu_);
  open_connections_ = std::move(f);
}

void OpenAIService::begin_drain() {
  draining_ = true;
}

int64_t OpenAIService::num_inflight() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(jobs_.size());
}

void OpenAIService::abort_all() {
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, j] : jobs_) jobs.push_back(j);
  }
  for (auto& j : jobs) j->cancel();
}

void OpenAIService::respond(const std::shared_ptr<ResponseWriter>& w, int status, const json& body,
                            std::vector<std::pair<std::string, std::string>> headers) {
  metrics_->count_http(status);
  HttpResponse r;
  r.status = status;
  r.body = dump_json(body);
  r.headers = std::move(headers);
  w->send(std::move(r));
}

void OpenAIService::respond_error(const std::shared_ptr<ResponseWriter>& w, const ApiError& e) {
  std::vector<std::pair<std::string, std::string>> headers;
  if (e.retry_after_s > 0) headers.emplace_back("Retry-After", std::to_string(e.retry_after_s));
  if (e.http_status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
  if (e.http_status >= 500 && e.http_status != 503)
    spdlog::error("[{}] {} {}", w->request_id(), e.http_status, e.message);
  respond(w, e.http_status, e.to_json(), std::move(headers));
}

std::optional<ApiError> OpenAIService::check_model(const std::string& model) const {
  for (const std::string& n : options_.model_names)
    if (n == model) return std::nullopt;
  return not_found_error("The model `" + model + "` does not exist or you do not have access to it.", "model",
                         "model_not_found");
}

ParseLimits OpenAIService::limits(const GenerationBackend* b) const {
  ParseLimits l;
  l.max_n = options_.max_n;
  l.max_logprobs = options_.max_logprobs;
  if (b) l.vocab_size = b->model_info().vocab_size;
  return l;
}

void OpenAIService::handle(HttpRequest req, std::shared_ptr<ResponseWriter> w) {
  try {
    const std::string& path = req.path;
    const RouteInfo* route = nullptr;
    for (const RouteInfo& r : kRoutes)
      if (path == r.path) route = &r;
    const bool model_path = path.rfind("/v1/models/", 0) == 0 && path.size() > 11;
    if (!route && !model_path) {
      respond_error(w, not_found_error("Invalid URL (" + req.method + " " + path + ")", "", "unknown_url"));
      return;
    }
    const char* method = route ? route->method : "GET";
    if (req.method != method) {
      ApiError e{405,
                 "Method " + req.method + " is not allowed for " + path + "; use " + method + ".",
                 "invalid_request_error",
                 "",
                 "method_not_allowed",
                 0};
      metrics_->count_http(405);
      HttpResponse r;
      r.status = 405;
      r.body = dump_json(e.to_json());
      r.headers = {{"Allow", method}};
      w->send(std::move(r));
      return;
    }
    const bool protected_path = path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
    if (protected_path && !options_.api_key.empty()) {
      const std::string_view auth = req.header("authorization");
      const std::string_view prefix = "Bearer ";
      if (auth.size() < prefix.size() || auth.substr(0, prefix.size()) != prefix ||
          !constant_time_equal(auth.substr(prefix.size()), options_.api_key)) {
        respond_error(w, ApiError{401,
                                  auth.empty() ? "You didn't provide an API key. Provide it in an Authorization header "
                                                 "as 'Bearer YOUR_KEY'."
                                               : "Incorrect API key provided.",
                                  "invalid_request_error", "", "invalid_api_key", 0});
        return;
      }
    }
    if (path == "/health") {
      respond(w, 200, {{"status", "ok"}});
    } else if (path == "/ready") {
      handle_ready(w);
    } else if (path == "/metrics") {
      handle_metrics(w);
    } else if (path == "/v1/models" || model_path) {
      handle_models(req, w);
    } else if (path == "/v1/chat/completions") {
      handle_generation(req, w, ApiKind::kChat);
    } else if (path == "/v1/completions") {
      handle_generation(req, w, ApiKind::kCompletion);
    } else if (path == "/tokenize") {
      handle_tokenize(req, w);
    } else if (path == "/detokenize") {
      handle_detokenize(req, w);
    }
  } catch (const std::exception& e) {
    respond_error(w, server_error("internal error (request " + req.request_id + "): " + e.what()));
  }
}

void OpenAIService::handle_ready(const std::shared_ptr<ResponseWriter>& w) {
  if (ready()) {
    respond(w, 200, {{"status", "ready"}});
    return;
  }
  std::string reason;
  {
    std::lock_guard lock(mu_);
    reason = draining_ ? "draining" : not_ready_reason_;
  }
  respond(w, 503, {{"status", reason}}, {{"Retry-After", "1"}});
}

void OpenAIService::handle_metrics(const std::shared_ptr<ResponseWriter>& w) {
  auto b = backend();
  EngineStats stats;
  if (b) stats = b->stats();
  ServerGauges g;
  {
    std::lock_guard lock(mu_);
    if (open_connections_) g.open_connections = open_connections_();
    g.inflight_requests = static_cast<int64_t>(jobs_.size());
  }
  g.queued_requests = *queued_;
  g.ready = ready();
  metrics_->count_http(200);
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = metrics_->render(stats, g);
  w->send(std::move(r));
}

void OpenAIService::handle_models(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w) {
  auto b = backend();
  auto model_json = [&](const std::string& name) {
    json m = {{"id", name},           {"object", "model"},           {"created", created_},
              {"owned_by", "osprey"}, {"root", options_.model_root}, {"parent", nullptr}};
    if (b) m["max_model_len"] = b->model_info().max_model_len;
    return m;
  };
  if (req.path == "/v1/models") {
    json data = json::array();
    if (!options_.model_names.empty()) data.push_back(model_json(options_.model_names[0]));
    respond(w, 200, {{"object", "list"}, {"data", std::move(data)}});
    return;
  }
  const std::string id = req.path.substr(11);
  if (auto e = check_model(id)) {
    respond_error(w, *e);
    return;
  }
  respond(w, 200, model_json(id));
}

void OpenAIService::handle_generation(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w, ApiKind kind) {
  const auto arrival = GenerationJob::Clock::now();
  auto body = parse_json_object(req.body);
  if (!body.ok()) return respond_error(w, *body.error);
  auto b = backend();
  auto parsed = kind == ApiKind::kChat ? parse_chat_request(*body.value, limits(b.get()))
                                       : parse_completion_request(*body.value, limits(b.get()));
  if (!parsed.ok()) return respond_error(w, *parsed.error);
  GenerationRequest& r = *parsed.value;
  if (auto e = check_model(r.model)) return respond_error(w, *e);
  if (draining_) return respond_error(w, unavailable_error("The server is shutting down.", 1));
  if (!ready_ || !b) return respond_error(w, unavailable_error("The model is not ready yet.", 1));

  const int max_len = b->model_info().max_model_len;
  std::vector<GenerationJob::Prompt> prompts;
  ToolParserKind tool_parser = ToolParserKind::kNone;  // parse the output for tool calls
  if (kind == ApiKind::kChat) {
    auto rendered = b->apply_chat_template(r.messages, r.tools, r.add_generation_prompt, r.chat_template_kwargs);
    if (!rendered.ok()) return respond_error(w, bad_request(rendered.status().message(), "messages"));
    prompts.push_back({b->encode(*rendered, r.add_special_tokens), ""});
    if (!r.tools.is_null() && !r.tool_choice_none) {
      tool_parser = this->tool_parser();
      // Markers that are special tokens must survive detokenization.
      if (tool_parser_needs_special_tokens(tool_parser) && !r.skip_special_tokens_given)
        r.params.skip_special_tokens = false;
    }
  } else {
    for (const PromptSpec& p : r.prompts) {
      GenerationJob::Prompt gp;
      if (p.is_tokens) {
        gp.token_ids = p.token_ids;
        if (r.echo) gp.echo_text = b->decode(gp.token_ids, false);
      } else {
        gp.token_ids = b->encode(p.text, r.add_special_tokens);
        gp.echo_text = p.text;
      }
      prompts.push_back(std::move(gp));
    }
  }
  int max_tokens = r.params.max_tokens;
  for (const auto& p : prompts) {
    const int len = static_cast<int>(p.token_ids.size());
    if (len == 0)
      return respond_error(w, bad_request("The prompt is empty after tokenization; give at least one token of input.",
                                          kind == ApiKind::kChat ? "messages" : "prompt", "empty_prompt"));
    if (max_len > 0 && len >= max_len)
      return respond_error(
          w, bad_request("This model's maximum context length is " + std::to_string(max_len) +
                             " tokens. However, your prompt is " + std::to_string(len) +
                             " tokens long, which leaves no room for a completion. Please reduce the length of the " +
                             (kind == ApiKind::kChat ? "messages." : "prompt."),
                         kind == ApiKind::kChat ? "messages" : "prompt", "context_length_exceeded"));
    if (max_len <= 0) continue;
    if (!r.max_tokens_given) {
      // Chat fills the context; completions default to 16, within the context.
      const int room = max_len - len;
      max_tokens = kind == ApiKind::kChat ? room : std::min(max_tokens, room);
    } else if (static_cast<int64_t>(len) + r.params.max_tokens > max_len) {
      return respond_error(
          w,
          bad_request("This model's maximum context length is " + std::to_string(max_len) +
                          " tokens. However, you requested " + std::to_string(len + int64_t{r.params.max_tokens}) +
                          " tokens (" + std::to_string(len) + " in the " +
                          (kind == ApiKind::kChat ? "messages, " : "prompt, ") + std::to_string(r.params.max_tokens) +
                          " in the completion). Please reduce the length of the input or of the completion.",
                      kind == ApiKind::kChat ? "messages" : "max_tokens", "context_length_exceeded"));
    }
  }
  r.params.max_tokens = std::max(1, max_tokens);
  if (r.params.min_tokens > r.params.max_tokens) r.params.min_tokens = r.params.max_tokens;

  if (options_.max_queue > 0 && *queued_ >= options_.max_queue)
    return respond_error(w, ApiError{429,
                                     "The server's queue is full (" + std::to_string(options_.max_queue) +
                                         " requests waiting); retry later.",
                                     "rate_limit_error", "", "queue_full", 1});

  ResponseMeta meta;
  meta.id = random_id(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-");
  meta.created = unix_time_s();
  meta.model = r.model;
  meta.fingerprint = options_.fingerprint;
  auto job = std::make_shared<GenerationJob>(std::move(r), std::move(prompts), meta, w, b, metrics_, arrival);
  job->tool_parser = tool_parser;
  ++*queued_;
  job->on_dequeued = [q = queued_] { --*q; };
  job->on_done = [this](const GenerationJob& j) {
    std::lock_guard lock(mu_);
    jobs_.erase(j.id());
  };
  {
    std::lock_guard lock(mu_);
    jobs_[meta.id] = job;
  }
  if (auto e = job->start()) {
    {
      std::lock_guard lock(mu_);
      jobs_.erase(meta.id);
    }
    if (e->http_status == 503) {
      ready_ = false;
      set_not_ready_reason("engine unavailable: " + e->message);
    }
    return respond_error(w, *e);
  }
  std::weak_ptr<GenerationJob> weak = job;
  w->on_disconnect([weak, id = w->request_id()] {
    if (auto j = weak.lock()) {
      spdlog::info("[{}] client disconnected; cancelling {}", id, j->id());
      j->cancel();
    }
  });
}

void OpenAIService::handle_tokenize(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w) {
  auto body = parse_json_object(req.body);
  if (!body.ok()) return respond_error(w, *body.error);
  auto b = backend();
  auto parsed = parse_tokenize_request(*body.value, limits(b.get()));
  if (!parsed.ok()) return respond_error(w, *parsed.error);
  const TokenizeRequest& r = *parsed.value;
  if (!r.model.empty())
    if (auto e = check_model(r.model)) return respond_error(w, *e);
  if (!b) return respond_error(w, unavailable_error("The model is not loaded yet.", 1));
  std::vector<int32_t> ids;
  if (r.is_chat) {
    auto rendered = b->apply_chat_template(r.messages, r.tools, r.add_generation_prompt, r.chat_template_kwargs);
    if (!rendered.ok()) return respond_error(w, bad_request(rendered.status().message(), "messages"));
    ids = b->encode(*rendered, r.add_special_tokens);
  } else {
    ids = b->encode(r.prompt, r.add_special_tokens);
  }
  json out = {{"count", ids.size()},
              {"max_model_len", b->model_info().max_model_len},
              {"tokens", ids},
              {"token_strs", nullptr}};
  if (r.return_token_strs) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(b->decode(std::span<const int32_t>(&id, 1), false));
    out["token_strs"] = std::move(strs);
  }
  respond(w, 200, out);
}

void OpenAIService::handle_detokenize(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w) {
  auto body = parse_json_object(req.body);
  if (!body.ok()) return respond_error(w, *body.error);
  auto b = backend();
  auto parsed = parse_detokenize_request(*body.value, limits(b.get()));
  if (!parsed.ok()) return respond_error(w, *parsed.error);
  if (!parsed.value->model.empty())
    if (auto e = check_model(parsed.value->model)) return respond_error(w, *e);
  if (!b) return respond_error(w, unavailable_error("The model is not loaded yet.", 1));
  respond(w, 200, {{"prompt", b->decode(parsed.value->tokens, false)}});
}

}  // namespace osprey::server
