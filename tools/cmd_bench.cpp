// osprey bench offline: in-process engine throughput (tools/bench_offline.h).
#include "bench_offline.h"
#include "commands.h"

namespace osprey::cli {

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  add_bench_offline_command(*bench);
}

}  // namespace osprey::cli
