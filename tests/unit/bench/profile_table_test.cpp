// The `bench offline --profile` table and JSON (tools/bench/profile_table.h)
// on a hand-made report: rates, shares and ceiling fractions.
#include "bench/profile_table.h"

#include <gtest/gtest.h>

namespace osprey::bench {
namespace {

ProfileReport report() {
  ProfileReport r;
  r.prefill_steps = 1;
  r.decode_steps = 4;
  r.copy_gbs = 4.0;
  r.gemm_tflops = 6.0;
  r.gemm_shape = "bf16 4096x4096x4096";
  // 2e9 bytes and 3e12 FLOPs in one second: 2 GB/s (50% of 4), 3 TFLOP/s (50% of 6).
  r.entries.push_back({"prefill", "matmul 64x32 BF16", 2, 1000.0, 2e9, 3e12});
  // 1e9 bytes in 3 s, no FLOPs.
  r.entries.push_back({"decode", "rms_norm", 8, 3000.0, 1e9, 0});
  return r;
}

TEST(ProfileTable, RatesSharesAndCeilings) {
  const std::string t = format_profile_table(report());
  EXPECT_NE(t.find("1 prefill and 4 decode steps"), std::string::npos) << t;
  EXPECT_NE(t.find("copy 4.0 GB/s"), std::string::npos) << t;
  EXPECT_NE(t.find("GEMM 6.00 TFLOP/s (bf16 4096x4096x4096)"), std::string::npos) << t;
  EXPECT_NE(t.find("[prefill]"), std::string::npos) << t;
  EXPECT_NE(t.find("[decode]"), std::string::npos) << t;
  EXPECT_NE(t.find("2.0 ( 50%)"), std::string::npos) << t;   // GB/s of the matmul
  EXPECT_NE(t.find("3.00 ( 50%)"), std::string::npos) << t;  // TFLOP/s of the matmul
  EXPECT_NE(t.find("25.0%"), std::string::npos) << t;        // 1 s of 4 s
  EXPECT_NE(t.find("75.0%"), std::string::npos) << t;
  EXPECT_NE(t.find("0.3 (  8%)"), std::string::npos) << t;  // rms_norm: 1e9 / 3 s = 0.33 GB/s
  EXPECT_NE(t.find("total decode"), std::string::npos) << t;
  EXPECT_TRUE(format_profile_table(ProfileReport{}).empty());
}

TEST(ProfileTable, Json) {
  const auto j = profile_to_json(report());
  EXPECT_DOUBLE_EQ(j["ceilings"]["copy_gb_per_s"].get<double>(), 4.0);
  EXPECT_EQ(j["steps"]["decode"].get<int64_t>(), 4);
  EXPECT_DOUBLE_EQ(j["total_ms"].get<double>(), 4000.0);
  ASSERT_EQ(j["groups"].size(), 2u);
  const auto& g = j["groups"][0];
  EXPECT_EQ(g["group"].get<std::string>(), "matmul 64x32 BF16");
  EXPECT_DOUBLE_EQ(g["share"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(g["gb_per_s"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(g["copy_fraction"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(g["tflops"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(g["gemm_fraction"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["groups"][1]["tflops"].get<double>(), 0.0);
}

}  // namespace
}  // namespace osprey::bench
