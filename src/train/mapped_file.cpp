// MappedFile: open, fstat, mmap(PROT_READ, MAP_SHARED); the descriptor is closed at once
// (the mapping keeps the file alive).
#include "train/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>

namespace hyper_parallel::train {

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "cannot open '", path_, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd);
    TORCH_CHECK(false, "'", path_, "' is not a regular file",
                S_ISREG(st.st_mode) ? std::string(": ") + std::strerror(err) : std::string());
  }
  size_ = static_cast<int64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    TORCH_CHECK(p != MAP_FAILED, "cannot map '", path_, "' (", size_, " bytes): ", std::strerror(err));
    data_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(size_));
}

}  // namespace hyper_parallel::train
