// Fuzzes the safetensors header parser (the bytes a Hugging Face checkpoint load trusts
// first): either the header parses into entries whose offsets lie inside the input, or a
// std::runtime_error names the file; never a crash, leak, hang or huge allocation.
#include <cstdint>
#include <stdexcept>

#include "models/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto h = hyper_parallel::hf::parse_safetensors_header(data, size, size, "fuzz.safetensors");
    for (const auto& [name, e] : h.tensors) {
      if (h.data_start + e.end > size || e.begin > e.end) __builtin_trap();  // accepted offsets must be inside
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
