// osprey: one CLI for serving, generating, inspecting and benchmarking.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>

#include "commands.h"

int main(int argc, char** argv) {
  // Logs go to stderr, so that stdout carries only a command's output
  // (generate's answer, the JSON of --json).
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  CLI::App app{"osprey: LLM inference engine and OpenAI-compatible server"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "osprey 0.1.0");
  osprey::cli::add_serve_command(app);
  osprey::cli::add_generate_command(app);
  osprey::cli::add_info_command(app);
  osprey::cli::add_text_commands(app);
  osprey::cli::add_bench_command(app);
  osprey::cli::add_plan_command(app);
  osprey::cli::add_perplexity_command(app);
  CLI11_PARSE(app, argc, argv);
  return osprey::cli::exit_code();
}
