#include "engine/kv_calibration.h"

#include <algorithm>
#include <cmath>

#include "tokenizer/tokenizer.h"

namespace osprey {

namespace {

// Written for this purpose: ordinary prose, a dialogue, code, numbers and a
// list, so that the activations span what prompts usually hold.
constexpr std::string_view kText =
    "The harbour was quiet before dawn. A few boats rocked against the pier, and a man in a yellow coat "
    "walked from one to the next, checking the ropes and writing numbers in a small notebook. When the "
    "first light reached the water he stopped, looked at the sky for a long time, and decided that nobody "
    "would go out to sea that day.\n\n"
    "\"Why not?\" asked the boy who helped him. \"The wind is calm.\"\n"
    "\"It is calm now,\" the man said. \"Look at the clouds over the hills. By noon the waves will be taller "
    "than the boats.\"\n\n"
    "def moving_average(values, window):\n"
    "    \"\"\"Return the averages of every run of `window` consecutive values.\"\"\"\n"
    "    if window <= 0 or window > len(values):\n"
    "        raise ValueError(f\"bad window {window} for {len(values)} values\")\n"
    "    total = sum(values[:window])\n"
    "    out = [total / window]\n"
    "    for i in range(window, len(values)):\n"
    "        total += values[i] - values[i - window]\n"
    "        out.append(total / window)\n"
    "    return out\n\n"
    "Quarterly results, in thousands: revenue 1,284.5 (up 7.2%), costs 963.1, operating profit 321.4; "
    "the ratio of debt to equity fell from 0.48 to 0.41 between March 31 and June 30, 2026.\n\n"
    "Things to pack for the trip:\n"
    "1. Two warm jumpers and a rain jacket.\n"
    "2. A map of the coast path, printed, since the phone signal is weak there.\n"
    "3. Sandwiches, water, and something sweet for the long climb after the lighthouse.\n\n"
    "Summary: the storm arrived earlier than forecast, the harbour master's decision kept every crew "
    "ashore, and the only damage was a broken railing near the fish market, repaired the next morning.";

}  // namespace

std::string_view kv_calibration_text() { return kText; }

std::vector<int32_t> kv_calibration_tokens(const Tokenizer* tokenizer, int vocab, int max_tokens) {
  std::vector<int32_t> ids;
  if (tokenizer) {
    ids = tokenizer->encode(kText, /*add_special_tokens=*/true);
  } else if (vocab > 0) {
    // A fixed linear congruential sequence: the same ids on every run.
    uint64_t x = 0x9e3779b97f4a7c15ull;
    ids.resize(512);
    for (int32_t& id : ids) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      id = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
    }
  }
  if (max_tokens >= 0 && ids.size() > static_cast<size_t>(max_tokens)) ids.resize(static_cast<size_t>(max_tokens));
  return ids;
}

float kv_scale_from_amax(float amax) {
  if (!std::isfinite(amax) || amax <= 0.0f) return 1.0f;
  const float s = amax / kKvCalibrationRange;
  return std::isfinite(s) && s > 0.0f ? s : 1.0f;
}

}  // namespace osprey
