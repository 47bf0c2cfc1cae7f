#include "loader/dummy_weights.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/hash.h"

namespace osprey {

Expected<DummyConfigText> read_dummy_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "config.json").string();
  if (!fs::is_regular_file(file, ec)) {
    return not_found("dummy weights need a model config: '" + path +
                     "' is neither a bundled config name, a config.json file, nor a folder with a config.json");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found("cannot read " + file);
  std::ostringstream text;
  text << in.rdbuf();
  DummyConfigText out;
  out.json = text.str();
  out.origin = file;
  if (out.json.empty()) return invalid_argument(file + " is empty");
  return out;
}

namespace {

// FNV-1a 64 of the name, mixed with the model seed.
uint64_t name_seed(std::string_view name, uint64_t model_seed) {
  return fnv1a64(name) ^ (model_seed * 0x9E3779B97F4A7C15ull);
}

}  // namespace

DummyFill dummy_fill(std::string_view name, uint64_t model_seed) {
  DummyFill f;
  f.seed = name_seed(name, model_seed);
  if (name.ends_with("norm.weight")) {
    f.lo = 1.0f;
    f.hi = 1.0f;
  } else if (name.ends_with(".bias")) {
    f.lo = -0.01f;
    f.hi = 0.01f;
  } else {
    const float a = kDummyStd * std::sqrt(3.0f);
    f.lo = -a;
    f.hi = a;
  }
  return f;
}

}  // namespace osprey
