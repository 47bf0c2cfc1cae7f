// libFuzzer target: SafetensorsFile::parse must return a value or an error
// for any input, never crash, hang, over-allocate or read out of bounds.
#include <cstddef>
#include <cstdint>

#include "loader/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = osprey::SafetensorsFile::parse(data, size, "fuzz.safetensors");
  if (r.ok()) {
    volatile uint8_t sink = 0;
    for (const auto& t : (*r)->tensors()) {
      if (t.nbytes > 0) sink = sink ^ t.data[0] ^ t.data[t.nbytes - 1];
      (void)(*r)->find_tensor(t.name);
    }
  }
  return 0;
}
