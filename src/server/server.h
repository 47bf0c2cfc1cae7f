// run_server: the whole `osprey serve` lifecycle. Listens at once (/health
// answers, /ready says "loading"), loads the model on a background thread,
// warms it up with a one-token generation, then serves until SIGINT/SIGTERM:
// stop accepting, drain in-flight requests for up to shutdown_timeout_s,
// abort the rest (finish_reason "abort"), exit 0.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "osprey/engine.h"
#include "server/generation_backend.h"
#include "server/http_server.h"

namespace osprey::server {

struct ServerConfig {
  EngineConfig engine;    // engine.model_path: resolved
  std::string model_arg;  // --model as given (accepted as a model name too)
  std::vector<std::string> served_model_names;
  HttpServerOptions http;
  std::string api_key;
  int max_queue = 0;
  double shutdown_timeout_s = 30.0;
  bool warmup = true;
  // --chat-template: a Jinja file replacing the model's own template ("": the model's).
  std::string chat_template_path;
  // --tool-call-parser: "auto" (from the chat template), "hermes", "llama3_json", "mistral" or "none".
  std::string tool_call_parser = "auto";
};

using BackendFactory = std::function<Expected<std::unique_ptr<GenerationBackend>>(const EngineConfig&)>;

// Names the model answers to: --served-model-name values, else the model
// file or folder name (".gguf" dropped); plus model_arg when different.
std::vector<std::string> model_names(const std::string& model_arg, const std::string& resolved_path,
                                     const std::vector<std::string>& served);

// Returns the process exit code (0 after a clean shutdown, 1 when the model
// could not be loaded or the address not bound).
int run_server(const ServerConfig& config, BackendFactory factory = make_engine_backend);

}  // namespace osprey::server
