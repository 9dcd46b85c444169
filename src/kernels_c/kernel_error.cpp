// kernel_error.h: the C interface's error channel.
#include "kernels_c/kernel_error.h"

#include <cstdio>

namespace hyper_parallel::kernels_c {

int32_t report(hpk_error* error, int32_t code, const char* function, const char* message) noexcept {
  if (!error) return code;
  error->code = code;
  if (function)
    std::snprintf(error->message, sizeof error->message, "%s: %s", function, message);
  else
    std::snprintf(error->message, sizeof error->message, "%s", message);
  return code;
}

}  // namespace hyper_parallel::kernels_c
