// OpenAIService: the routes of `osprey serve` (the HttpHandler of the
// transport). Authentication, routing (404/405), model names, admission
// (draining, readiness, --max-queue), prompt preparation (chat template,
// tokenization, context checks) and GenerationJobs in flight.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/generation_backend.h"
#include "server/generation_job.h"
#include "server/http_types.h"
#include "server/metrics.h"
#include "server/tool_parser.h"

namespace osprey::server {

struct ServiceOptions {
  std::vector<std::string> model_names;  // accepted "model" values; the first is listed and echoed
  std::string model_root;                // the model path, shown in /v1/models
  std::string api_key;                   // "" : no authentication
  int max_queue = 0;                     // admitted requests without output at most; 0: unlimited
  int max_n = 128;
  int max_logprobs = 20;
  std::string fingerprint = "fp_osprey";
  // "auto" (picked from the backend's chat template in set_backend), "hermes",
  // "llama3_json", "mistral" or "none".
  std::string tool_call_parser = "auto";
};

class OpenAIService {
 public:
  explicit OpenAIService(ServiceOptions options);

  // The backend once loaded; generation is admitted once set_ready(true).
  void set_backend(std::shared_ptr<GenerationBackend> backend);
  // The parser used for chat requests with tools (resolved by set_backend).
  ToolParserKind tool_parser() const;
  void set_ready(bool ready);
  // Why /ready says no (e.g. "loading", "failed: ...", "draining").
  void set_not_ready_reason(std::string reason);
  bool ready() const;
  void set_connection_counter(std::function<int64_t()> open_connections);

  void handle(HttpRequest request, std::shared_ptr<ResponseWriter> writer);

  // New generation requests get 503; in-flight ones continue.
  void begin_drain();
  int64_t num_inflight() const;
  // Aborts every in-flight generation (finish_reason "abort").
  void abort_all();

  std::shared_ptr<ServerMetrics> metrics() const { return metrics_; }

 private:
  void respond(const std::shared_ptr<ResponseWriter>& w, int status, const nlohmann::ordered_json& body,
               std::vector<std::pair<std::string, std::string>> headers = {});
  void respond_error(const std::shared_ptr<ResponseWriter>& w, const ApiError& e);
  std::shared_ptr<GenerationBackend> backend() const;
  std::optional<ApiError> check_model(const std::string& model) const;
  ParseLimits limits(const GenerationBackend* b) const;

  void handle_generation(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w, ApiKind kind);
  void handle_tokenize(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w);
  void handle_detokenize(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w);
  void handle_models(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w);
  void handle_ready(const std::shared_ptr<ResponseWriter>& w);
  void handle_metrics(const std::shared_ptr<ResponseWriter>& w);

  ServiceOptions options_;
  std::shared_ptr<ServerMetrics> metrics_;
  int64_t created_;
  mutable std::mutex mu_;
  std::shared_ptr<GenerationBackend> backend_;
  ToolParserKind tool_parser_ = ToolParserKind::kNone;
  std::string not_ready_reason_ = "loading";
  std::function<int64_t()> open_connections_;
  std::unordered_map<std::string, std::shared_ptr<GenerationJob>> jobs_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  std::shared_ptr<std::atomic<int64_t>> queued_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace osprey::server
