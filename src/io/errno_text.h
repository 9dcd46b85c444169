// The OS's words for an errno value ("No space left on device"), for error messages that
// name what failed and why.
#pragma once

#include <stdexcept>
#include <string>
#include <system_error>

namespace hyper_parallel::io {

inline std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// std::runtime_error "<what> '<path>': <errno_text(err)>".
[[noreturn]] inline void throw_os_error(const std::string& what, const std::string& path, int err) {
  throw std::runtime_error(what + " '" + path + "': " + errno_text(err));
}

}  // namespace hyper_parallel::io
