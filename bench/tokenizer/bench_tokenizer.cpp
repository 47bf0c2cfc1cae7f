// Single-thread encode throughput of osprey::Tokenizer on the benchmark text
// (documents separated by "\n\0DOC\0\n"; see make_bench_text.py).
//
// Usage: bench_tokenizer TEXT.txt NAME=path/to/tokenizer.json ...
// Prints MB/s (best of 3 passes; pass 1 also reported, cold word cache),
// token count and an FNV-1a hash of all ids comparable with bench_hf.py.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TEXT NAME=tokenizer.json ...\n", argv[0]);
    return 2;
  }
  std::ifstream f(argv[1], std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const std::string sep("\n\0DOC\0\n", 7);
  std::vector<std::string_view> docs;
  size_t pos = 0, nbytes = 0;
  while (true) {
    size_t e = text.find(sep, pos);
    std::string_view d(text.data() + pos, (e == std::string::npos ? text.size() : e) - pos);
    docs.push_back(d);
    nbytes += d.size();
    if (e == std::string::npos) break;
    pos = e + sep.size();
  }
  for (int a = 2; a < argc; ++a) {
    std::string spec = argv[a];
    size_t eq = spec.find('=');
    std::string name = spec.substr(0, eq), path = spec.substr(eq + 1);
    auto t0 = std::chrono::steady_clock::now();
    auto tok = osprey::Tokenizer::from_path(path);
    double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), tok.status().to_string().c_str());
      return 1;
    }
    double best = 1e30, first = 0;
    uint64_t hash = 0;
    size_t count = 0;
    for (int pass = 0; pass < 3; ++pass) {
      uint64_t h = 1469598103934665603ull;
      size_t n = 0;
      auto s = std::chrono::steady_clock::now();
      for (auto d : docs) {
        auto ids = (*tok)->encode(d, false);
        for (int32_t id : ids) {
          h ^= static_cast<uint32_t>(id);
          h *= 1099511628211ull;
        }
        n += ids.size();
      }
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
      if (pass == 0) first = dt;
      best = std::min(best, dt);
      hash = h;
      count = n;
    }
    std::printf("osprey %s: %.2f MB/s (first pass %.2f MB/s), %zu tokens, hash %016llx, load %.2f s\n",
                name.c_str(), nbytes / best / 1e6, nbytes / first / 1e6, count,
                static_cast<unsigned long long>(hash), load_s);
  }
  return 0;
}
