// Fuzzes what a resume reads before it trusts a rank file: the step manifest
// (read_manifest, its table of tensor layouts included, then read_verified_rank_file
// against a fixed rank file). Either the manifest and the file verify, or a
// std::runtime_error names the file; never a crash, leak or hang.
//
// The rank file itself is not fuzzed: a resume hands LibTorch's archive reader only
// bytes whose size and CRC-32C match the manifest, because that reader trusts what a
// file claims (fuzzing found tensors that overrun their buffer, and a pickled length of
// 4 GB reserved before reading — torch::jit::Unpickler::readBytes).
#include <cstdint>
#include <fstream>
#include <stdexcept>

#include "fuzz_file.h"
#include "train/checkpoint/checkpoint_manifest.h"

using namespace hyper_parallel::train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool rank_file_in_place = [] {
    std::ifstream in(HP_FUZZ_SEED_RANK_FILE, std::ios::binary);
    std::ofstream(hyper_parallel::fuzz::scratch_dir() + "/rank-0.pt", std::ios::binary) << in.rdbuf();
    return true;
  }();
  (void)rank_file_in_place;
  hyper_parallel::fuzz::write_input("manifest.json", data, size);
  try {
    const std::string dir = hyper_parallel::fuzz::scratch_dir();
    const StepManifest manifest = read_manifest(dir);
    (void)read_verified_rank_file(dir, manifest, 0);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
