// FP8 KV-page scales calibrated at start-up (EngineConfig::calculate_kv_scales).
//
// A checkpoint without KV scales leaves F8_E4M3 pages at scale 1: values
// past 448 saturate and values under 2^-6 (E4M3's smallest normal) keep
// fewer than its 3 mantissa bits, down to nothing under 2^-10. Small
// models' K and V sit mostly in that range. Calibration runs a built-in text
// through the model once, with pages in the activation dtype, and sets each
// layer's K and V scale from the largest magnitude it wrote:
//   scale = amax / kKvCalibrationRange
// so the calibration's largest value lands at kKvCalibrationRange, with
// 448 / kKvCalibrationRange of headroom for larger values in later prompts.
// Relative precision of normal E4M3 values does not depend on the scale, so
// the headroom costs only the tiny values' precision (under amax / 2^14 or
// so). ModelExecutor::initialize runs it (model_executor.cpp).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace osprey {

class Tokenizer;

// Where the calibration's largest |K| or |V| of a layer lands in E4M3 (max 448).
inline constexpr float kKvCalibrationRange = 224.0f;

// The text the scales are calibrated on (prose, code, numbers, a list).
std::string_view kv_calibration_text();

// Its tokens, special tokens added as for a prompt (so BOS, whose keys are
// often the largest, is seen), at most max_tokens of them; without a
// tokenizer (dummy models), ids spread over [0, vocab) from a fixed seed.
std::vector<int32_t> kv_calibration_tokens(const Tokenizer* tokenizer, int vocab, int max_tokens);

// scale = amax / kKvCalibrationRange; a layer that wrote only zeros (or
// nothing finite) keeps scale 1.
float kv_scale_from_amax(float amax);

}  // namespace osprey
