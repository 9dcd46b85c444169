// Fuzzes what a resume reads before it trusts a file: a rank file's metadata
// (read_tensor_file_metadata: LibTorch's zip archive, no tensor data touched) and the
// step manifest (read_manifest) must load or throw std::runtime_error naming the file,
// never crash, leak or hang. (read_tensor_file itself only sees files whose CRC-32C
// matched the manifest: on forged archives LibTorch gives tensors that overrun their
// buffer; regression-storage-too-small.pt in the corpus is such an input.)
#include <cstdint>
#include <stdexcept>

#include "fuzz_file.h"
#include "train/checkpoint_io.h"
#include "train/checkpoint_manifest.h"

using namespace hyper_parallel::train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hyper_parallel::fuzz::write_input("rank-0.pt", data, size);
  try {
    const std::string metadata = read_tensor_file_metadata(path);
    (void)metadata;
  } catch (const std::runtime_error&) {
  }
  hyper_parallel::fuzz::write_input("manifest.json", data, size);
  try {
    const StepManifest manifest = read_manifest(hyper_parallel::fuzz::scratch_dir());
    (void)manifest;
  } catch (const std::runtime_error&) {
  }
  return 0;
}
