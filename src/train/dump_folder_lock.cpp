// dump_folder_lock.cpp — see dump_folder_lock.h.
#include "train/dump_folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "compat/file_system.h"

namespace hyper_parallel::train {
namespace {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

}  // namespace

std::string dump_folder_lock_path(const std::string& folder) { return compat::join_path(folder, ".hp-train.lock"); }

std::string read_dump_folder_lock_record(const std::string& folder) {
  std::ifstream in(dump_folder_lock_path(folder), std::ios::binary);
  std::string line;
  std::getline(in, line);
  return line;
}

DumpFolderLock::DumpFolderLock(const std::string& folder) {
  if (compat::path_exists(folder) && !compat::is_directory(folder)) {
    throw std::runtime_error("job.dump_folder '" + folder +
                             "' is a file, not a folder: move the file away or choose another --job.dump_folder");
  }
  std::string error;
  if (!compat::create_directories(folder, &error)) throw std::runtime_error("job.dump_folder: " + error);
  const std::string path = dump_folder_lock_path(folder);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw std::runtime_error("cannot open the dump folder's lock file '" + path + "': " + std::strerror(errno));
  int rc;
  do {
    rc = ::flock(fd_, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) {
      throw std::runtime_error("cannot lock the dump folder's lock file '" + path + "': " + std::strerror(err));
    }
    const std::string holder = read_dump_folder_lock_record(folder);
    throw std::runtime_error("job.dump_folder '" + folder + "' is in use by another job (" +
                             (holder.empty() ? std::string("its holder has not recorded itself yet") : holder) +
                             ", holding " + path +
                             "): two jobs in one folder would mix their checkpoints and "
                             "metrics. Wait for it to end, stop it, or choose another --job.dump_folder");
  }
  // The pid alone is not unique over time; the start time tells two holders apart.
  const auto since =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::ostringstream record;
  record << "pid " << ::getpid() << " on host " << host_name() << ", locked at " << since << " ns";
  record_ = record.str();
  const std::string text = record_ + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("cannot write the dump folder's lock file '" + path + "': " + std::strerror(err));
  }
}

DumpFolderLock::~DumpFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace hyper_parallel::train
