// Fuzzes the Megatron .idx parser, which reads untrusted sizes and offsets from a file:
// the input is a little-endian u32 (the .bin size) followed by the .idx bytes. Either the
// index parses, with every document start inside the .bin, or a c10::Error names the
// field; never a crash, an out-of-bounds read or a huge allocation.
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "train/data/megatron_indexed_dataset.h"

using namespace hyper_parallel::train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t bin_bytes = 0;
  std::memcpy(&bin_bytes, data, 4);
  try {
    const MegatronIndex index = parse_megatron_index(data + 4, static_cast<int64_t>(size - 4), bin_bytes, "fuzz.idx");
    const int64_t tokens = static_cast<int64_t>(bin_bytes) / token_dtype_size(index.dtype);
    for (size_t d = 0; d + 1 < index.document_token_starts.size(); ++d) {
      if (index.document_token_starts[d] > index.document_token_starts[d + 1]) std::abort();
    }
    if (index.document_token_starts.back() != tokens) std::abort();
  } catch (const c10::Error&) {
  }
  return 0;
}
