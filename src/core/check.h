// OSP_CHECK: invariants whose violation is a bug. Aborts with file, line and
// the values involved; never used for conditions that bad input can cause.
#pragma once

#include <sstream>
#include <string>

namespace osprey::detail {

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& detail);

template <class A, class B>
std::string format_pair(const A& a, const B& b) {
  std::ostringstream os;
  os << a << " vs " << b;
  return os.str();
}

}  // namespace osprey::detail

#define OSP_CHECK(cond)                                                      \
  do {                                                                       \
    if (!(cond)) ::osprey::detail::check_failed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define OSP_CHECK_MSG(cond, msg)                                                \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::ostringstream osp_os_;                                               \
      osp_os_ << msg;                                                           \
      ::osprey::detail::check_failed(__FILE__, __LINE__, #cond, osp_os_.str()); \
    }                                                                           \
  } while (0)

#define OSP_CHECK_OP_(a, b, op)                                              \
  do {                                                                       \
    const auto& osp_a_ = (a);                                                \
    const auto& osp_b_ = (b);                                                \
    if (!(osp_a_ op osp_b_))                                                 \
      ::osprey::detail::check_failed(__FILE__, __LINE__, #a " " #op " " #b,  \
                                     ::osprey::detail::format_pair(osp_a_, osp_b_)); \
  } while (0)

#define OSP_CHECK_EQ(a, b) OSP_CHECK_OP_(a, b, ==)
#define OSP_CHECK_NE(a, b) OSP_CHECK_OP_(a, b, !=)
#define OSP_CHECK_LT(a, b) OSP_CHECK_OP_(a, b, <)
#define OSP_CHECK_LE(a, b) OSP_CHECK_OP_(a, b, <=)
#define OSP_CHECK_GT(a, b) OSP_CHECK_OP_(a, b, >)
#define OSP_CHECK_GE(a, b) OSP_CHECK_OP_(a, b, >=)
