// Fuzzes the YAML op specs: load_op_spec_files must register the ops or throw an
// exception with a message, never crash. (Ops it registers stay registered: the
// registry is process-wide; names already taken are an error, as for users.)
#include <cstdint>
#include <exception>
#include <string>

#include "dispatch/op_spec_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    hyper_parallel::load_op_spec_files({{"fuzz.yaml", text}});
  } catch (const std::exception&) {
    // c10::Error naming file and line, or yaml-cpp's conversion errors
  }
  return 0;
}
