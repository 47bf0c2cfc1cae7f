// Engine internals shared by engine.cpp, engine_create.cpp and tests: build
// an Engine from an Executor and a TextCodec (the real model, or fakes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/executor.h"
#include "engine/text_codec.h"
#include "osprey/engine.h"
#include "osprey/text.h"

namespace osprey {

struct EngineParts {
  std::unique_ptr<Executor> executor;
  std::unique_ptr<TextCodec> codec;
  std::vector<int32_t> eos_token_ids;  // the model's; the codec's eos is added
  int model_max_len = 0;               // the model's context length (0: unknown)
  size_t kv_bytes_per_token = 0;       // for sizing the pool from kv_cache_bytes
  std::string model_path;
  std::shared_ptr<const TextProcessor> text;  // tokenizer + chat template; null for fakes
};

Expected<std::unique_ptr<Engine>> make_engine(const EngineConfig& config, EngineParts parts);

}  // namespace osprey
