#include "loader/dummy_weights.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

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
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h ^ (model_seed * 0x9E3779B97F4A7C15ull);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

DummyFill dummy_fill(std::string_view name, uint64_t model_seed) {
  DummyFill f;
  f.seed = name_seed(name, model_seed);
  if (ends_with(name, "norm.weight")) {
    f.lo = 1.0f;
    f.hi = 1.0f;
  } else if (ends_with(name, ".bias")) {
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
