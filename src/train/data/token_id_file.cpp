#include "train/data/token_id_file.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace hyper_parallel::train {

namespace {

void write_all(int fd, const void* data, size_t bytes, off_t offset, const std::string& what, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n > 0, what, ": cannot write its token ids to the temporary file '", path,
                "': ", n < 0 ? std::strerror(errno) : "no progress", " (set TMPDIR to a folder with room)");
    p += n;
    offset += n;
    bytes -= static_cast<size_t>(n);
  }
}

void read_all(int fd, void* data, size_t bytes, off_t offset, const std::string& what, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n > 0, what, ": cannot read back its token ids from '", path,
                "': ", n < 0 ? std::strerror(errno) : "unexpected end of file");
    p += n;
    offset += n;
    bytes -= static_cast<size_t>(n);
  }
}

}  // namespace

TokenIdFile::TokenIdFile(std::string what) : what_(std::move(what)) {
  const char* tmp = std::getenv("TMPDIR");
  path_ = std::string(tmp && *tmp ? tmp : "/tmp") + "/hp-corpus-ids-XXXXXX";
  fd_ = ::mkstemp(path_.data());
  TORCH_CHECK(fd_ >= 0, what_, ": cannot create a temporary file for its token ids in '", path_,
              "': ", std::strerror(errno), " (set TMPDIR to a writable folder)");
  ::unlink(path_.c_str());
  buffer_.reserve(kBlock);
}

TokenIdFile::~TokenIdFile() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenIdFile::flush() {
  if (buffer_.empty()) return;
  write_all(fd_, buffer_.data(), buffer_.size() * sizeof(int64_t), static_cast<off_t>(written_ * 8), what_, path_);
  written_ += static_cast<int64_t>(buffer_.size());
  buffer_.clear();
}

void TokenIdFile::for_each_block(int64_t end, bool rewrite, const std::function<void(int64_t*, int64_t)>& f) {
  flush();
  TORCH_CHECK(fd_ >= 0 && end <= written_, what_, ": token id range [0, ", end, ") is not in the file");
  std::vector<int64_t> block(kBlock);
  for (int64_t first = 0; first < end; first += static_cast<int64_t>(kBlock)) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(kBlock), end - first);
    const auto offset = static_cast<off_t>(first * 8);
    read_all(fd_, block.data(), static_cast<size_t>(n) * 8, offset, what_, path_);
    f(block.data(), n);
    if (rewrite) write_all(fd_, block.data(), static_cast<size_t>(n) * 8, offset, what_, path_);
  }
}

at::Tensor TokenIdFile::map() {
  flush();
  TORCH_CHECK(fd_ >= 0, what_, ": its token ids were already mapped");
  const int64_t n = written_;
  if (n == 0) {
    ::close(fd_);
    fd_ = -1;
    return at::empty({0}, at::kLong);
  }
  const size_t bytes = static_cast<size_t>(n) * 8;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd_, 0);
  TORCH_CHECK(p != MAP_FAILED, what_, ": cannot map its token ids (", bytes, " bytes of '", path_,
              "'): ", std::strerror(errno));
  ::close(fd_);  // the mapping keeps the (unlinked) file alive
  fd_ = -1;
  return at::from_blob(
      p, {n}, [bytes](void* q) { ::munmap(q, bytes); }, at::TensorOptions().dtype(at::kLong));
}

}  // namespace hyper_parallel::train
