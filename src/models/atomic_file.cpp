#include "models/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "compat/file_system.h"

namespace hyper_parallel::hf {

namespace {

// Unique per call: ranks as threads of one process may write files side by side.
std::string temp_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw std::runtime_error("cannot write " + path + ": " + what + ": " + std::strerror(err));
}

}  // namespace

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& fill) {
  const std::string temp = temp_name(path);
  std::FILE* f = std::fopen(temp.c_str(), "wb");
  if (!f) fail(path, "cannot create " + temp, errno);
  int err = 0;
  errno = 0;  // what a failed fwrite inside fill leaves is the reason
  try {
    fill(f);
  } catch (...) {
    std::fclose(f);
    ::unlink(temp.c_str());
    throw;
  }
  if (std::ferror(f) || std::fflush(f) != 0) err = errno ? errno : EIO;
  if (!err && ::fsync(::fileno(f)) != 0) err = errno;
  if (std::fclose(f) != 0 && !err) err = errno;
  if (!err && std::rename(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err) {
    ::unlink(temp.c_str());
    fail(path, "writing " + temp + " failed", err);
  }
  sync_folder(compat::parent_path(path));  // the rename itself durable
}

void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace hyper_parallel::hf
