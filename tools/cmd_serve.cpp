// osprey serve: the OpenAI-compatible HTTP server (docs/server.md).
#include <cstdio>
#include <memory>
#include <thread>

#include "commands.h"
#include "server/server.h"

namespace osprey::cli {

namespace {

struct ServeOptions {
  EngineOptions engine;
  std::vector<std::string> served_model_names;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  int max_queue = 0;
  double shutdown_timeout = 30.0;
  std::vector<std::string> cors_origins;
  int io_threads = 2;
  int workers = 0;
  double max_body_mb = 8.0;
  double request_timeout = 30.0;
  double keep_alive_timeout = 60.0;
  std::string chat_template;
  std::string tool_call_parser = "auto";
  int64_t seed = 0;  // EngineConfig::seed: base of the seeds of unseeded requests
};

int run_serve(const ServeOptions& o, const EngineConfigSink& dry_run) {
  auto engine = resolve_engine_config(o.engine);
  if (!engine.ok()) {
    std::fprintf(stderr, "osprey: %s\n", engine.status().to_string().c_str());
    return 1;
  }
  server::ServerConfig c;
  c.model_arg = o.engine.model;
  c.served_model_names = o.served_model_names;
  c.engine = *engine;
  c.engine.seed = static_cast<uint64_t>(o.seed);
  if (dry_run) {
    dry_run(c.engine);
    return 0;
  }
  c.http.host = o.host;
  c.http.port = o.port;
  c.http.num_io_threads = o.io_threads;
  c.http.num_worker_threads =
      o.workers > 0 ? o.workers : static_cast<int>(std::max(2u, std::min(8u, std::thread::hardware_concurrency())));
  c.http.max_body_bytes = static_cast<size_t>(o.max_body_mb * 1024 * 1024);
  c.http.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.request_timeout * 1000));
  c.http.keep_alive_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.keep_alive_timeout * 1000));
  c.http.cors_origins = o.cors_origins;
  c.api_key = o.api_key;
  if (c.api_key.empty())
    if (const char* env = std::getenv("OSPREY_API_KEY")) c.api_key = env;
  c.max_queue = o.max_queue;
  c.shutdown_timeout_s = o.shutdown_timeout;
  c.chat_template_path = o.chat_template;
  c.tool_call_parser = o.tool_call_parser;
  return server::run_server(c);
}

}  // namespace

void add_serve_command(CLI::App& app, EngineConfigSink dry_run) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  add_engine_options(cmd, &o->engine);
  cmd->add_option("--served-model-name", o->served_model_names,
                  "Name(s) clients use in 'model' (default: the model file name)");
  cmd->add_option("--host", o->host, "Address to listen on");
  cmd->add_option("--port", o->port, "Port to listen on (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on /v1/* (or $OSPREY_API_KEY)");
  cmd->add_option("--max-queue", o->max_queue,
                  "Requests waiting for their first token at most; more get 429 (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout,
                  "Seconds to drain in-flight requests after SIGTERM before aborting them")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--cors-origin", o->cors_origins, "Allow browser requests from this origin ('*' for any)");
  cmd->add_option("--io-threads", o->io_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  cmd->add_option("--http-workers", o->workers, "Threads that parse, template and tokenize requests (0: auto)")
      ->check(CLI::Range(0, 256));
  cmd->add_option("--max-body-mb", o->max_body_mb, "Largest request body in MiB (larger: 413)")
      ->check(CLI::Range(0.001, 1024.0));
  cmd->add_option("--request-timeout", o->request_timeout,
                  "Seconds a client has to send a whole request once it started (slower: 408)")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--keep-alive-timeout", o->keep_alive_timeout, "Seconds an idle keep-alive connection is kept")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--chat-template", o->chat_template,
                  "Jinja file replacing the model's chat template")
      ->check(CLI::ExistingFile);
  cmd->add_option("--tool-call-parser", o->tool_call_parser,
                  "How tool calls are read from chat output: auto (from the chat template), hermes, llama3_json, "
                  "mistral, none")
      ->check(CLI::IsMember({"auto", "hermes", "llama3_json", "mistral", "none"}));
  cmd->add_option("--seed", o->seed, "Base seed of unseeded requests");
  cmd->callback([o, dry_run] { exit_code() = run_serve(*o, dry_run); });
}

}  // namespace osprey::cli
