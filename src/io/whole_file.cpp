#include "io/whole_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "compat/file_system.h"
#include "io/crc32c.h"
#include "io/errno_text.h"

namespace hyper_parallel::io {

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), temp_path_(path_ + ".tmp-" + std::to_string(::getpid())) {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_os_error("cannot write '" + path_ + "': cannot create its temporary file", temp_path_, errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

size_t AtomicFile::write(const void* data, size_t size) noexcept {
  if (error_ != 0) return size;
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_, p + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      error_ = errno;
      return size;
    }
    done += static_cast<size_t>(n);
  }
  crc_ = io::crc32c(data, size, crc_);
  bytes_ += static_cast<int64_t>(size);
  return size;
}

void AtomicFile::commit(const std::function<void()>& before_rename) {
  if (error_ != 0) throw_os_error("cannot write", path_, error_);
  if (::fsync(fd_) != 0) throw_os_error("cannot fsync", path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_os_error("cannot close", path_, errno);
  if (before_rename) before_rename();
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    throw_os_error("cannot rename " + temp_path_ + " to", path_, errno);
  }
  committed_ = true;
  sync_folder(compat::parent_path(path_));  // the rename itself durable
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  AtomicFile file(path);
  file.write(bytes);
  file.commit();
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_os_error("cannot open", path, errno);
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw_os_error("cannot read", path, errno);
  return buffer.str();
}

void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

bool is_temp_file_name(const std::string& name) {
  const auto pos = name.rfind(".tmp-");
  if (pos == std::string::npos || pos + 5 == name.size()) return false;
  return name.find_first_not_of("0123456789", pos + 5) == std::string::npos;
}

}  // namespace hyper_parallel::io
