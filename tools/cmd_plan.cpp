// osprey plan: memory and roofline estimates for a model on a GPU, before
// anyone buys one (tools/plan/, docs/plan.md).
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "osprey/model_info.h"
#include "plan/plan_report.h"
#include "plan/planner.h"

namespace osprey::cli {

namespace {

struct PlanArgs {
  std::string model = "default";
  std::string gpu;
  std::string gpu_file;
  std::string batch;
  std::string compare;
  bool json = false;
  bool list_gpus = false;
  plan::PlanOptions options;
  plan::GpuOverrides overrides;
};

int fail(const Status& s) {
  std::fprintf(stderr, "osprey plan: %s\n", s.to_string().c_str());
  return 1;
}

Expected<plan::GpuTable> load_table(const PlanArgs& a) {
  plan::GpuTable table = plan::GpuTable::builtin();
  if (a.gpu_file.empty()) return table;
  std::ifstream in(a.gpu_file, std::ios::binary);
  if (!in) return not_found("cannot open GPU file '" + a.gpu_file + "'");
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > (1u << 20)) return invalid_argument("GPU file '" + a.gpu_file + "' is larger than 1 MiB");
  OSP_RETURN_IF_ERROR(table.merge_json(text.str(), a.gpu_file));
  return table;
}

Expected<plan::PlanResult> plan_one(const ModelShape& shape, const plan::GpuTable& table, const std::string& gpu_name,
                                    const plan::GpuOverrides& overrides, const plan::PlanOptions& options) {
  OSP_ASSIGN_OR_RETURN(plan::GpuSpec gpu, table.find(gpu_name));
  OSP_ASSIGN_OR_RETURN(gpu, plan::apply_overrides(gpu, overrides));
  return plan::make_plan(shape, gpu, options);
}

int run_plan(PlanArgs a) {
  auto table = load_table(a);
  if (!table.ok()) return fail(table.status());
  if (a.list_gpus) {
    std::printf("%-12s %-24s %8s %8s %9s %9s %9s  %s\n", "key", "name", "GiB", "GB/s", "bf16 TF", "fp8 TF", "int8 TOP",
                "link GB/s per direction");
    for (const plan::GpuSpec& g : table->entries()) {
      std::printf("%-12s %-24s %8.0f %8.0f %9.1f %9.1f %9.1f  %.0f (%s)%s\n", g.key.c_str(), g.name.c_str(),
                  g.memory_gib, g.bandwidth_gbs, g.tflops_16, g.tflops_fp8, g.tops_int8, g.link_gbs, g.link.c_str(),
                  g.approximate ? "  approximate" : "");
    }
    return 0;
  }
  if (!a.batch.empty()) {
    auto batches = plan::parse_batches(a.batch);
    if (!batches.ok()) return fail(batches.status());
    a.options.batches = *batches;
  }
  auto shape = model_shape(a.model);
  if (!shape.ok()) return fail(shape.status());

  if (a.compare.empty()) {
    if (a.gpu.empty()) return fail(invalid_argument("--gpu is required (known: " + table->key_list() + ")"));
    auto p = plan_one(*shape, *table, a.gpu, a.overrides, a.options);
    if (!p.ok()) return fail(p.status());
    std::fputs((a.json ? plan::format_json(*p) : plan::format_text(*p)).c_str(), stdout);
    return 0;
  }

  auto spec = plan::parse_compare(a.compare);
  if (!spec.ok()) return fail(spec.status());
  if (spec->field != "gpu" && a.gpu.empty()) {
    return fail(invalid_argument("--compare " + spec->field + "=... needs --gpu"));
  }
  std::vector<plan::CompareColumn> columns;
  int planned = 0;
  for (const std::string& v : spec->values) {
    std::string gpu = a.gpu;
    plan::PlanOptions o = a.options;
    if (spec->field == "gpu") {
      gpu = v;
    } else if (spec->field == "dtype") {
      o.dtype = v;
    } else if (spec->field == "kv-dtype") {
      o.kv_dtype = v;
    } else {
      if (v.empty() || v.size() > 4 || v.find_first_not_of("0123456789") != std::string::npos) {
        return fail(invalid_argument("--compare tp=... takes positive integers, got '" + v + "'"));
      }
      o.tp = std::stoi(v);
    }
    auto p = plan_one(*shape, *table, gpu, a.overrides, o);
    plan::CompareColumn c;
    c.value = v;
    if (p.ok()) {
      c.plan = std::move(p).value();
      ++planned;
    } else if (p.status().code() == StatusCode::kUnsupported) {
      c.error = p.status().message();  // e.g. fp8 on a GPU without fp8: a column, not a failure
    } else {
      return fail(p.status());
    }
    columns.push_back(std::move(c));
  }
  std::fputs(
      (a.json ? plan::format_compare_json(spec->field, columns) : plan::format_compare_text(spec->field, columns))
          .c_str(),
      stdout);
  return planned > 0 ? 0 : 1;
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("plan", "Estimate memory, TTFT, TPOT and cost of a model on a GPU (roofline; docs/plan.md)");
  auto a = std::make_shared<PlanArgs>();
  plan::PlanOptions& o = a->options;
  cmd->add_option("--model", a->model,
                  "Bundled name (llama-3-8b, llama-3.1-8b, llama-3-70b, llama-3.2-1b, qwen2.5-7b, mistral-7b, "
                  "smollm2-135m), config.json, model folder, .gguf, or 'default'");
  cmd->add_option("--gpu", a->gpu, "GPU key (see --list-gpus) or 'custom' with --mem-gb/--bw-gbs/--tflops-bf16");
  cmd->add_option("--gpu-file", a->gpu_file, "JSON file adding or overriding GPU entries (docs/plan.md)");
  cmd->add_flag("--list-gpus", a->list_gpus, "Print the GPU table and exit");
  cmd->add_option("--tp", o.tp, "Tensor-parallel GPUs")->default_val(1);
  cmd->add_option("--dtype", o.dtype,
                  "Weights: bf16, fp16, fp32, fp8, int8 (W8A8), int4 (W4A16), q8_0, q4_0, q4_1, or file (a GGUF's own "
                  "bytes; the default for a .gguf, else bf16)");
  cmd->add_option("--head-dtype", o.head_dtype,
                  "Embedding / lm_head format (default: bf16 for fp8/int8/int4, q8_0 for GGUF types)");
  cmd->add_option("--weight-bits", o.weight_bits, "Bits per weight of the layer matrices, overriding --dtype's");
  cmd->add_option("--kv-dtype,--kv-cache-dtype", o.kv_dtype,
                  "KV cache: bf16, fp16, fp8 (fp8_e4m3), int8, fp32 (default bf16); --kv-cache-dtype as serve's");
  cmd->add_option("--context", o.context,
                  "Context length per sequence for decode and batch sizing (default min(4096, model max))");
  cmd->add_option("--prompt-len", o.prompt_len, "Prompt tokens for TTFT (default min(1024, model max))");
  cmd->add_option("--batch", a->batch,
                  "Decode batch sizes, comma-separated (default 1,8,32,64,128,256; the largest that fits is added)");
  cmd->add_option("--price-per-hour", o.price_per_hour, "$ per GPU-hour, for cost per million output tokens");
  cmd->add_option("--gpu-memory-utilization", o.gpu_memory_utilization, "Fraction of GPU memory osprey may use")
      ->default_val(0.9);
  cmd->add_option("--mbu", o.mbu, "Expected fraction of memory bandwidth achieved")->default_val(0.8);
  cmd->add_option("--mfu", o.mfu, "Expected fraction of the matmul rate achieved")->default_val(0.6);
  cmd->add_option("--max-batched-tokens", o.max_batched_tokens, "Token budget of a step (sizes the activation reserve)")
      ->default_val(8192);
  cmd->add_option("--overhead-gib", o.overhead_gib, "Fixed reserve: CUDA context, cuBLAS workspace, graphs (GiB)")
      ->default_val(1.0);
  cmd->add_option("--block-size", o.block_size, "KV page size in tokens")->default_val(16);
  cmd->add_option("--compare", a->compare, "Side by side: gpu=A,B,... | dtype=A,B | kv-dtype=A,B | tp=1,2,4");
  cmd->add_flag("--json", a->json, "JSON output");
  plan::GpuOverrides& g = a->overrides;
  cmd->add_option("--mem-gb", g.memory_gib, "Override: GPU memory, GiB");
  cmd->add_option("--bw-gbs", g.bandwidth_gbs, "Override: memory bandwidth, GB/s");
  cmd->add_option("--tflops-bf16", g.tflops_16, "Override: dense 16-bit rate, TFLOP/s (a CPU: its fp32 FMA rate)");
  cmd->add_option("--tflops-fp8", g.tflops_fp8, "Override: dense FP8 rate, TFLOP/s (0: none)");
  cmd->add_option("--tops-int8", g.tops_int8, "Override: dense INT8 rate, TOP/s (0: none)");
  cmd->add_option("--link-gbs", g.link_gbs, "Override: GPU-to-GPU bandwidth per direction, GB/s");
  cmd->add_option("--allreduce-latency-us", g.link_latency_us, "Override: fixed cost of one all-reduce, us");
  cmd->callback([a] { exit_code() = run_plan(*a); });
}

}  // namespace osprey::cli
