#include "models/staged_folder.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "compat/file_system.h"
#include "io/whole_file.h"

namespace hyper_parallel::hf {

namespace {

[[noreturn]] void fail_on_folder(const std::string& what, const std::string& path, int err) {
  throw std::runtime_error("cannot " + what + " '" + path + "': " + std::strerror(err));
}

std::string without_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// The folder a symlink names is the one replaced, not the link.
std::string resolved(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) != nullptr) return buf;
  return path;
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string staging_prefix(const std::string& target) { return "." + base_name(target) + ".hp-staging-"; }

// Staging folders of `target` whose process is gone (kill(pid, 0) finds no such process).
void remove_abandoned_staging(const std::string& parent, const std::string& target) {
  const std::string prefix = staging_prefix(target);
  for (const std::string& name : compat::list_directory(parent.empty() ? "." : parent)) {
    if (name.rfind(prefix, 0) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &end, 10);
    if (end == name.c_str() + prefix.size() || *end != '\0' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) compat::remove_all(compat::join_path(parent, name));
  }
}

}  // namespace

StagedFolder::StagedFolder(const std::string& target) : target_(without_trailing_slashes(target)) {
  if (compat::path_exists(target_)) target_ = resolved(target_);
  const std::string parent = compat::parent_path(target_);
  std::string why;
  if (!parent.empty() && !compat::create_directories(parent, &why)) {
    throw std::runtime_error("cannot create the folder '" + parent + "': " + why);
  }
  remove_abandoned_staging(parent, target_);
  staging_ = compat::join_path(parent, staging_prefix(target_) + std::to_string(::getpid()));
  compat::remove_all(staging_);  // this process's own, from an earlier call that threw in commit
  if (::mkdir(staging_.c_str(), 0755) != 0) fail_on_folder("create the staging folder", staging_, errno);
}

StagedFolder::~StagedFolder() {
  if (!committed_) compat::remove_all(staging_);
}

void StagedFolder::commit(const std::function<bool(const std::string& name)>& carry_over) {
  const std::string parent = compat::parent_path(target_);
  if (!compat::path_exists(target_)) {
    if (std::rename(staging_.c_str(), target_.c_str()) != 0)
      fail_on_folder("move the staging folder to", target_, errno);
    committed_ = true;
    io::sync_folder(parent);
    return;
  }
  if (!compat::is_directory(target_)) {
    throw std::runtime_error("'" + target_ + "' is a file, not a folder: move it away or choose another folder");
  }
  // The user's files go over first, files as hard links (they stay in the old folder until
  // the swap, so a crash loses none), folders moved.
  for (const std::string& name : compat::list_directory(target_)) {
    const std::string to = compat::join_path(staging_, name);
    if (compat::path_exists(to) || !carry_over(name)) continue;
    const std::string from = compat::join_path(target_, name);
    if (!compat::is_directory(from) && ::link(from.c_str(), to.c_str()) == 0) continue;
    if (std::rename(from.c_str(), to.c_str()) != 0) fail_on_folder("move into the new folder", from, errno);
  }
  io::sync_folder(staging_);
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    committed_ = true;  // staging_ now holds the old folder
  } else if (errno == EINVAL || errno == ENOSYS) {
    const std::string old = staging_ + "-old";
    if (std::rename(target_.c_str(), old.c_str()) != 0) fail_on_folder("move aside the earlier folder", target_, errno);
    if (std::rename(staging_.c_str(), target_.c_str()) != 0) {
      const int err = errno;
      std::rename(old.c_str(), target_.c_str());
      fail_on_folder("move the staging folder to", target_, err);
    }
    committed_ = true;
    staging_ = old;
  } else {
    fail_on_folder("swap in the staging folder for", target_, errno);
  }
  io::sync_folder(parent);
  compat::remove_all(staging_);
}

}  // namespace hyper_parallel::hf
