#include "core/check.h"

#include <cstdio>
#include <cstdlib>

namespace osprey::detail {

void check_failed(const char* file, int line, const char* expr, const std::string& detail) {
  std::fprintf(stderr, "osprey: check failed at %s:%d: %s%s%s\n", file, line, expr,
               detail.empty() ? "" : " (", detail.empty() ? "" : (detail + ")").c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace osprey::detail
