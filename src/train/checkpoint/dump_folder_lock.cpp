// dump_folder_lock.cpp — see dump_folder_lock.h.
#include "train/checkpoint/dump_folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
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

// (device, inode) of an existing folder; nullopt when it is not there.
std::optional<std::pair<uint64_t, uint64_t>> folder_identity(const std::string& folder) {
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) return std::nullopt;
  return std::pair<uint64_t, uint64_t>{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

}  // namespace

std::string dump_folder_lock_path(const std::string& folder) { return compat::join_path(folder, ".hp-train.lock"); }

std::string read_dump_folder_lock_record(const std::string& folder) {
  std::ifstream in(dump_folder_lock_path(folder), std::ios::binary);
  std::string line;
  std::getline(in, line);
  return line;
}

std::vector<std::unique_ptr<DumpFolderLock>> lock_folders(
    const std::vector<std::pair<std::string, std::string>>& folders) {
  std::vector<std::unique_ptr<DumpFolderLock>> locks;
  for (const auto& [key, folder] : folders) {
    const auto id = folder_identity(folder);
    const bool held =
        id && std::any_of(locks.begin(), locks.end(), [&](const auto& l) { return l->folder_id() == *id; });
    if (!held) locks.push_back(std::make_unique<DumpFolderLock>(folder, key));
  }
  return locks;
}

DumpFolderLock::DumpFolderLock(const std::string& folder, const std::string& key) {
  if (compat::path_exists(folder) && !compat::is_directory(folder)) {
    throw std::runtime_error(key + " '" + folder +
                             "' is a file, not a folder: move the file away or choose another --" + key);
  }
  std::string error;
  if (!compat::create_directories(folder, &error)) throw std::runtime_error(key + ": " + error);
  const std::string path = dump_folder_lock_path(folder);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw std::runtime_error(key + ": cannot write a file in '" + folder + "': its lock file " + path + ": " +
                             std::strerror(errno) + " (checked at start, before training)");
  int rc;
  do {
    rc = ::flock(fd_, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) {
      throw std::runtime_error("cannot lock the lock file of " + key + " '" + path + "': " + std::strerror(err));
    }
    const std::string holder = read_dump_folder_lock_record(folder);
    throw std::runtime_error(key + " '" + folder + "' is in use by another job (" +
                             (holder.empty() ? std::string("its holder has not recorded itself yet") : holder) +
                             ", holding " + path +
                             "): two jobs writing one folder would mix their checkpoints and "
                             "metrics. Wait for it to end, stop it, or choose another --" +
                             key);
  }
  folder_id_ = folder_identity(folder).value_or(std::pair<uint64_t, uint64_t>{0, 0});
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
    throw std::runtime_error("cannot write the lock file of " + key + " '" + path + "': " + std::strerror(err));
  }
}

DumpFolderLock::~DumpFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace hyper_parallel::train
