// libFuzzer target: GgufFile::parse must return a value or an error for any
// input, never crash, hang, over-allocate or read out of bounds.
#include <cstddef>
#include <cstdint>

#include "loader/gguf_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = osprey::GgufFile::parse(data, size, "fuzz.gguf");
  if (r.ok()) {
    // Touch everything the parser promised is in bounds.
    const osprey::GgufFile& f = **r;
    volatile uint8_t sink = 0;
    for (const auto& t : f.tensors()) {
      if (t.nbytes > 0) sink = sink ^ t.data[0] ^ t.data[t.nbytes - 1];
      (void)f.find_tensor(t.name);
    }
    for (const auto& [key, value] : f.metadata()) {
      (void)f.get_int(key);
      (void)f.get_float(key);
      (void)f.get_string(key);
      (void)f.get_int_array(key);
      (void)f.get_float_array(key);
      (void)f.get_string_array(key);
    }
  }
  return 0;
}
