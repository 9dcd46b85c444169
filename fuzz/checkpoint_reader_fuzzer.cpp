// Fuzzes the checkpoint readers: read_tensor_file (LibTorch's zip archive plus our
// checksums) and read_manifest must load the input or throw std::runtime_error naming
// the file, never crash, leak or hang.
#include <cstdint>
#include <stdexcept>

#include "fuzz_file.h"
#include "train/checkpoint_io.h"
#include "train/checkpoint_manifest.h"

using namespace hyper_parallel::train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hyper_parallel::fuzz::write_input("rank-0.pt", data, size);
  try {
    const TensorFile file = read_tensor_file(path);
    (void)file;
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
