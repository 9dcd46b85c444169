// storage_checks.cpp — see storage_checks.h.
#include "train/checkpoint/storage_checks.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "compat/file_system.h"

namespace hyper_parallel::train {
namespace {

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

void check_writable_folder(const std::string& folder, const std::string& key, const std::string& tag) {
  std::string error;
  if (!compat::create_directories(folder, &error)) throw std::runtime_error(key + ": " + error);
  const std::string probe = compat::join_path(folder, ".hp-write-probe-" + std::to_string(::getpid()) + "-" + tag);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const bool written = fd >= 0 && ::write(fd, "x", 1) == 1;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  const bool removed = fd < 0 || ::unlink(probe.c_str()) == 0;
  if (!written || !removed) {
    throw std::runtime_error(key + ": cannot " + (written ? "remove a file in" : "write a file in") + " '" + folder +
                             "': " + std::strerror(written ? errno : err) + " (checked at start, before training)");
  }
}

std::optional<int64_t> free_bytes(const std::string& folder) {
  struct statvfs st {};
  if (::statvfs(folder.c_str(), &st) != 0) return std::nullopt;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

std::optional<std::string> room_warning(const std::string& folder, int64_t free, int64_t needed) {
  if (free >= needed) return std::nullopt;
  return "the checkpoint folder '" + folder + "' has " + mib(free) + " free, less than one checkpoint (about " +
         mib(needed) + ": weights and AdamW moments of every rank): its saves will fail unless room is made";
}

}  // namespace hyper_parallel::train
