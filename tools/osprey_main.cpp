// osprey: one CLI for serving, generating, inspecting and benchmarking.
#include <cstdio>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"osprey: LLM inference engine and OpenAI-compatible server"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "osprey 0.1.0");
  osprey::cli::add_serve_command(app);
  osprey::cli::add_generate_command(app);
  osprey::cli::add_info_command(app);
  osprey::cli::add_text_commands(app);
  osprey::cli::add_bench_command(app);
  osprey::cli::add_plan_command(app);
  CLI11_PARSE(app, argc, argv);
  return osprey::cli::exit_code();
}
