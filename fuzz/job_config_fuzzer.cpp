// Fuzzes the TOML job config: load_job_config_file + validate must either give a config
// or throw std::invalid_argument (a message for the user), never crash; and a config that
// loads must round-trip through to_toml unchanged.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "fuzz_file.h"
#include "hyper_parallel_train/config/job_config.h"

using namespace hyper_parallel::train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hyper_parallel::fuzz::write_input("job.toml", data, size);
  JobConfig cfg;
  try {
    cfg = load_job_config_file(path);
  } catch (const std::invalid_argument&) {
    return 0;  // a rejected file: the documented outcome
  }
  try {
    validate(cfg);
  } catch (const std::invalid_argument&) {
  }
  const std::string toml = to_toml(cfg);
  const std::string again_path =
      hyper_parallel::fuzz::write_input("again.toml", reinterpret_cast<const uint8_t*>(toml.data()), toml.size());
  const std::string again = to_toml(load_job_config_file(again_path));
  if (again != toml) {
    std::fprintf(stderr, "to_toml does not round-trip:\n--- first\n%s\n--- second\n%s\n", toml.c_str(), again.c_str());
    std::abort();
  }
  return 0;
}
