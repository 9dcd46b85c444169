#include "compat/file_system.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace hyper_parallel::compat {

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  return static_cast<int64_t>(st.st_size);
}

bool create_directories(const std::string& path, std::string* error) {
  if (path.empty() || is_directory(path)) return true;
  const std::string parent = parent_path(path);
  if (!parent.empty() && parent != path && !create_directories(parent, error)) return false;
  if (::mkdir(path.c_str(), 0777) != 0 && !(errno == EEXIST && is_directory(path))) {
    // EEXIST alone ("File exists") does not say that the thing in the way is a file.
    const std::string reason =
        errno == EEXIST ? "a file of that name is in the way (it is not a folder)" : std::strerror(errno);
    if (error) *error = "cannot create directory '" + path + "': " + reason;
    return false;
  }
  return true;
}

void remove_all(const std::string& path) {
  if (!path_exists(path)) return;
  ::nftw(
      path.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) {
        ::remove(p);  // best effort, like rm -rf
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

std::vector<std::string> list_directory(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(path.c_str());
  if (!dir) return names;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> list_directory_recursive(const std::string& path) {
  std::vector<std::string> out;
  for (const auto& name : list_directory(path)) {
    out.push_back(name);
    const std::string full = join_path(path, name);
    if (is_directory(full)) {
      for (const auto& sub : list_directory_recursive(full)) out.push_back(join_path(name, sub));
    }
  }
  return out;
}

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty() || (!b.empty() && b[0] == '/')) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

std::string parent_path(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string current_directory() {
  std::vector<char> buf(4096);
  while (!::getcwd(buf.data(), buf.size())) {
    if (errno != ERANGE) return ".";  // removed or unreadable: relative paths still mean "here"
    buf.resize(buf.size() * 2);
  }
  return buf.data();
}

std::string temp_directory() {
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

}  // namespace hyper_parallel::compat
