// The C interface's error channel (internal): a KernelError carries an hpk_status code and a
// message naming what was expected and what was found; run_guarded turns it, and any other
// exception, into the status and the caller's hpk_error, so that nothing C++ crosses the
// interface.
#pragma once

#include <cstdint>
#include <exception>
#include <new>
#include <sstream>
#include <string>
#include <utility>

#include "hyper_parallel_kernels/loss_kernels.h"

namespace hyper_parallel::kernels_c {

class KernelError : public std::exception {
 public:
  KernelError(int32_t code, std::string message) : code_(code), message_(std::move(message)) {}
  int32_t code() const { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  int32_t code_;
  std::string message_;
};

// Throws KernelError(code, the parts' text).
template <typename... Parts>
[[noreturn]] void fail(int32_t code, const Parts&... parts) {
  std::ostringstream text;
  (text << ... << parts);
  throw KernelError(code, text.str());
}

// Fills `error` (when not null) with `code` and "function: message" (truncated to fit; no
// allocation, so it cannot fail) and returns `code`.
int32_t report(hpk_error* error, int32_t code, const char* function, const char* message) noexcept;

// Runs body(); returns HPK_OK, or the status of what it threw (HPK_ERROR_INTERNAL for anything
// but a KernelError), its message prefixed by `function`.
template <typename Body>
int32_t run_guarded(const char* function, hpk_error* error, Body&& body) noexcept {
  try {
    body();
    return report(error, HPK_OK, nullptr, "");
  } catch (const KernelError& e) {
    return report(error, e.code(), function, e.what());
  } catch (const std::bad_alloc&) {
    return report(error, HPK_ERROR_INTERNAL, function, "out of memory");
  } catch (const std::exception& e) {
    return report(error, HPK_ERROR_INTERNAL, function, e.what());
  } catch (...) {
    return report(error, HPK_ERROR_INTERNAL, function, "an unknown exception inside the library");
  }
}

}  // namespace hyper_parallel::kernels_c
