// Arrival schedules of benchmark requests: when each conversation is due,
// in seconds from the start of a run. A --max-concurrency limit applies on
// top (a due request waits for a free slot).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "osprey/status.h"

namespace osprey::bench {

struct ArrivalOptions {
  // "poisson": exponential gaps of mean 1 / rate; "constant": gaps of exactly 1 / rate;
  // "burst": burst_size requests at once every burst_interval_s seconds.
  std::string kind = "poisson";
  double rate = 0;              // requests / s; <= 0 or infinite: every request at t = 0 (poisson, constant)
  int burst_size = 1;
  double burst_interval_s = 1.0;
  uint64_t seed = 0;
};

// num_requests non-decreasing offsets starting at 0 (the first request is due at once).
Expected<std::vector<double>> arrival_times(const ArrivalOptions& options, int num_requests);

// "1,2,4,inf" -> {1, 2, 4, +inf}; a list of positive numbers or "inf".
Expected<std::vector<double>> parse_number_list(const std::string& text);

}  // namespace osprey::bench
