// Subcommands of the `osprey` CLI. Each registers itself on the app and runs
// through its callback; tools use only include/osprey.
#pragma once

#include <CLI/CLI.hpp>

#include "engine_options.h"

namespace osprey::cli {

void add_info_command(CLI::App& app);
void add_text_commands(CLI::App& app);  // tokenize, detokenize, template
// dry_run (tests): see EngineConfigSink (engine_options.h).
void add_generate_command(CLI::App& app, EngineConfigSink dry_run = nullptr);
void add_bench_command(CLI::App& app, EngineConfigSink dry_run = nullptr);  // `bench offline`
void add_serve_command(CLI::App& app, EngineConfigSink dry_run = nullptr);
void add_plan_command(CLI::App& app);  // tools/plan/, docs/plan.md
void add_perplexity_command(CLI::App& app, EngineConfigSink dry_run = nullptr);  // tools/perplexity.h

// Set by a command's callback; main returns it.
int& exit_code();

}  // namespace osprey::cli
