// Engine::create: the real model and tokenizer behind the engine. Kept apart
// from engine.cpp so that tests with a fake executor do not link the model.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "engine/engine_impl.h"
#include "engine/kv_calibration.h"
#include "engine/model_executor.h"
#include "engine/tokenizer_loader.h"
#include "model/model.h"
#include "ops/backend.h"
#include "ops/profiling_backend.h"
#include "osprey/model_info.h"
#include "osprey/text.h"

namespace osprey {

namespace {

Expected<std::unique_ptr<ops::Backend>> make_backend(const EngineConfig& config) {
  if (config.device == "cpu") return ops::make_cpu_backend(config.num_threads, config.quantize_activations);
  if (config.device.rfind("cuda", 0) == 0) {
#ifdef OSPREY_HAVE_CUDA
    int index = 0;
    if (config.device.size() > 4) {
      if (config.device[4] != ':' || config.device.size() == 5) {
        return invalid_argument("device must be cpu, cuda or cuda:N, got '" + config.device + "'");
      }
      try {
        index = std::stoi(config.device.substr(5));
      } catch (...) {
        return invalid_argument("device must be cpu, cuda or cuda:N, got '" + config.device + "'");
      }
    }
    auto backend = ops::make_cuda_backend(index);
    if (!backend) return Status(StatusCode::kUnavailable, "cannot open CUDA device " + std::to_string(index));
    return backend;
#else
    return unsupported("this osprey was built without the CUDA backend (device '" + config.device + "')");
#endif
  }
  return invalid_argument("device must be cpu, cuda or cuda:N, got '" + config.device + "'");
}

// Device backends without an explicit KV size: the pool gets
// total x gpu_memory_utilization - (memory in use after weights, step
// buffers and a profiling forward at max_num_batched_tokens).
Status size_kv_pool(const EngineConfig& config, ModelExecutor& exec, size_t kv_bytes_per_token, DType kv_dtype,
                    int model_max_len, EngineConfig& sized) {
  if (exec.backend().device() == Device::kCpu || config.kv_cache_bytes_explicit || config.num_kv_blocks > 0)
    return Status::Ok();
  if (kv_bytes_per_token == 0) return invalid_argument("KV bytes per token unknown");
  if (config.block_size <= 0 || config.max_num_batched_tokens <= 0 || config.max_num_seqs <= 0)
    return Status::Ok();  // make_engine reports these
  int max_len = config.max_model_len > 0 ? config.max_model_len : model_max_len;
  if (max_len <= 0) max_len = 4096;
  exec.set_limits(config.max_num_seqs, max_len);
  // As Scheduler::max_logit_rows().
  const int prompt_rows = config.enable_chunked_prefill ? std::max(1, config.max_prompt_logprob_rows)
                                                        : config.max_num_batched_tokens;
  OSP_ASSIGN_OR_RETURN(ModelExecutor::MemoryProfile prof,
                       exec.profile_memory(config.max_num_batched_tokens, config.max_num_seqs + prompt_rows,
                                           config.block_size));
  if (!prof.measured) return Status::Ok();
  const size_t page_bytes = kv_bytes_per_token * static_cast<size_t>(config.block_size);
  OSP_ASSIGN_OR_RETURN(int64_t pages, kv_pages_from_memory(prof.free_bytes, prof.total_bytes,
                                                           config.gpu_memory_utilization, page_bytes));
  sized.num_kv_blocks = static_cast<int>(pages);
  const double mib = 1.0 / (1 << 20);
  spdlog::info(
      "device memory: {:.0f} MiB total x {:.2f} utilization; in use before step buffers {:.0f} MiB (weights {:.0f} "
      "MiB as stored, context), after the profiling forward at {} tokens {:.0f} MiB (activations, workspaces, "
      "sampler: {:.0f} MiB); KV pool {} pages of {} tokens = {} tokens, {:.0f} MiB ({} pages, {} bytes a token)",
      prof.total_bytes * mib, config.gpu_memory_utilization, prof.before_bytes * mib, prof.weight_bytes * mib,
      config.max_num_batched_tokens, prof.in_use_bytes * mib, (prof.in_use_bytes - prof.before_bytes) * mib, pages,
      config.block_size, pages * config.block_size, static_cast<double>(pages) * page_bytes * mib, dtype_name(kv_dtype),
      kv_bytes_per_token);
  return Status::Ok();
}

}  // namespace

Expected<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  if (config.model_path.empty()) return invalid_argument("no model path given");
  OSP_ASSIGN_OR_RETURN(std::string path, resolve_model_path(config.model_path));
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<ops::Backend> backend, make_backend(config));
  if (config.profile) {
    // Ceilings first, while the device's memory is free; then every op goes through the profiler.
    const ops::Ceilings ceilings = ops::measure_ceilings(*backend);
    auto profiler = std::make_unique<ops::ProfilingBackend>(std::move(backend));
    profiler->set_ceilings(ceilings);
    backend = std::move(profiler);
  }
  ModelLoadOptions load;
  load.load_format = config.load_format;
  load.dtype = config.dtype;
  load.kv_cache_dtype = config.kv_cache_dtype;
  load.quantization = config.quantization;
  load.tokenizer = config.tokenizer;
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(path, *backend, load));
  OSP_ASSIGN_OR_RETURN(ModelText model_text, load_model_text(*model));
  EngineParts parts;
  parts.eos_token_ids.assign(model->config().eos_token_ids.begin(), model->config().eos_token_ids.end());
  parts.model_max_len = model->config().max_position_embeddings;
  parts.kv_bytes_per_token = model->kv_bytes_per_token();
  const DType kv_dtype = model->kv_dtype();
  ExecutorOptions exec_options;
  if (config.calculate_kv_scales) {
    if (kv_dtype != DType::kF8E4M3) {
      return invalid_argument("--calculate-kv-scales needs FP8 KV pages (--kv-cache-dtype fp8), not " +
                              std::string(dtype_name(kv_dtype)));
    }
    exec_options.kv_calibration_tokens =
        kv_calibration_tokens(model_text.tokenizer.get(), model->config().vocab_size, config.max_num_batched_tokens);
    if (model->kv_scale_layers() > 0) {
      spdlog::info("FP8 KV pages: calibrated scales replace the checkpoint's ({} ...)", model->kv_scale_name());
    }
  } else if (model->kv_scale_layers() == 0) {
    spdlog::warn(
        "FP8 KV pages with scale 1 in every layer: the checkpoint holds no KV scales (self_attn.k_scale / v_scale or "
        "another tool's names, docs/cuda.md); values past 448 saturate and values under 2^-6 lose precision "
        "(--calculate-kv-scales calibrates them at start-up)");
  } else if (model->kv_scale_layers() > 0) {
    spdlog::info("FP8 KV pages: the checkpoint's KV scales ({} ...) in {} of {} layers, 1 in the others",
                 model->kv_scale_name(), model->kv_scale_layers(), model->config().num_layers);
  }
  parts.model_path = path;
  parts.codec = std::move(model_text.codec);
  if (model_text.tokenizer) parts.text = TextProcessor::wrap(model_text.tokenizer);  // null: token ids only
  exec_options.enable_graphs = !config.enforce_eager && !config.profile;  // no timer marks inside a graph
  auto executor = std::make_unique<ModelExecutor>(std::move(backend), std::move(model), exec_options);
  EngineConfig sized = config;
  OSP_RETURN_IF_ERROR(size_kv_pool(config, *executor, parts.kv_bytes_per_token, kv_dtype, parts.model_max_len, sized));
  parts.executor = std::move(executor);
  return make_engine(sized, std::move(parts));
}

}  // namespace osprey
