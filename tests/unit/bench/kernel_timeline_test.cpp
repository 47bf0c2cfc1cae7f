// The kernel timeline summary (tools/bench/kernel_timeline.h): gating time
// charged to the oldest running kernel, idle and overlap, and the kernel
// name shortening, on hand-made spans.
#include "bench/kernel_timeline.h"

#include <gtest/gtest.h>

namespace osprey::bench {
namespace {

const KernelTimelineRow* row(const KernelTimeline& t, const std::string& name) {
  for (const auto& r : t.rows)
    if (r.name == name) return &r;
  return nullptr;
}

TEST(KernelTimeline, EmptyIsZero) {
  const KernelTimeline t = summarize_kernel_timeline({});
  EXPECT_EQ(t.wall_us, 0);
  EXPECT_EQ(t.idle_us, 0);
  EXPECT_TRUE(t.rows.empty());
}

// a [0, 10) us, b [8, 20) (starts under a's tail, as a PDL prologue),
// gap [20, 25), c [25, 30), a again [30, 31).
TEST(KernelTimeline, OverlapIsChargedToTheOldestKernel) {
  const std::vector<KernelSpan> spans = {{"b", 8000, 20000}, {"a", 0, 10000}, {"c", 25000, 30000}, {"a", 30000, 31000}};
  const KernelTimeline t = summarize_kernel_timeline(spans);
  EXPECT_DOUBLE_EQ(t.wall_us, 31.0);
  EXPECT_DOUBLE_EQ(t.idle_us, 5.0);
  EXPECT_DOUBLE_EQ(t.overlap_us, 2.0);
  const KernelTimelineRow* a = row(t, "a");
  const KernelTimelineRow* b = row(t, "b");
  const KernelTimelineRow* c = row(t, "c");
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->calls, 2);
  EXPECT_DOUBLE_EQ(a->busy_us, 11.0);
  EXPECT_DOUBLE_EQ(a->gating_us, 11.0);  // [0, 10) (b overlapping from 8) and [30, 31)
  EXPECT_DOUBLE_EQ(b->busy_us, 12.0);
  EXPECT_DOUBLE_EQ(b->gating_us, 10.0);  // [10, 20): a had ended
  EXPECT_DOUBLE_EQ(c->gating_us, 5.0);
  // Gating plus idle is the wall time; rows by gating, largest first.
  EXPECT_DOUBLE_EQ(a->gating_us + b->gating_us + c->gating_us + t.idle_us, t.wall_us);
  EXPECT_EQ(t.rows.front().name, "a");
  EXPECT_EQ(t.rows.back().name, "c");
  const std::string text = format_kernel_timeline(t);
  EXPECT_NE(text.find("wall 31.0 us, idle 5.0 us"), std::string::npos) << text;
}

// A kernel wholly inside another's span, and three running at once.
TEST(KernelTimeline, NestedAndTripleOverlap) {
  const std::vector<KernelSpan> spans = {{"x", 0, 100}, {"y", 10, 50}, {"z", 20, 120}, {"bad", 200, 150}};
  const KernelTimeline t = summarize_kernel_timeline(spans);
  EXPECT_DOUBLE_EQ(t.wall_us, 0.2);
  EXPECT_DOUBLE_EQ(t.idle_us, 0.08);            // [120, 200)
  EXPECT_DOUBLE_EQ(row(t, "x")->gating_us, 0.1);  // [0, 100): x is the oldest throughout
  EXPECT_DOUBLE_EQ(row(t, "y")->gating_us, 0.0);
  EXPECT_DOUBLE_EQ(row(t, "z")->gating_us, 0.02);  // [100, 120)
  EXPECT_DOUBLE_EQ(row(t, "bad")->busy_us, 0.0);   // end before start: empty
  EXPECT_DOUBLE_EQ(t.overlap_us, 0.09);            // [10, 100)
}

TEST(KernelTimeline, ShortNames) {
  EXPECT_EQ(short_kernel_name("void osprey::cuda::(anonymous namespace)::gemv_kernel<(osprey::DType)9, __nv_bfloat16, "
                              "__nv_bfloat16, true, 1, 2>(char const*, long, long, long, __nv_bfloat16 const*, int)"),
            "gemv_kernel");
  EXPECT_EQ(short_kernel_name("osprey::cuda::rms_norm_x8_kernel(float const*, float*)"), "rms_norm_x8_kernel");
  EXPECT_EQ(short_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32"), "sm90_xmma_gemm_bf16bf16_bf16f32");
  EXPECT_EQ(short_kernel_name("void f<(anonymous namespace)::T>(int)"), "f");
  EXPECT_EQ(short_kernel_name(""), "");
}

}  // namespace
}  // namespace osprey::bench
