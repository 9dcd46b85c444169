// MappedFile: open, fstat, mmap(PROT_READ, MAP_SHARED); the descriptor is closed at once
// (the mapping keeps the file alive).
//
// A file truncated under the mapping (`truncate`, a tool rewriting the corpus in place)
// makes a read of its lost pages raise SIGBUS, which would kill the rank naming nothing.
// Every mapping is entered in a fixed table that a SIGBUS handler searches: a fault inside
// one prints which file shrank and exits with status 1; any other SIGBUS goes to the
// handler that was there before (the default: the usual signal).
#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>

namespace hyper_parallel::io {

namespace {

// One mapping the SIGBUS handler knows: `message` is written as it is (no formatting in a
// signal handler). A slot is in use while `begin` is set.
struct MappedRange {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  char message[1024];
  size_t length = 0;
};

constexpr size_t kRanges = 256;
MappedRange g_ranges[kRanges];
std::mutex g_ranges_mutex;  // registration only; the handler reads the atomics
struct sigaction g_previous_sigbus {};

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const MappedRange& r : g_ranges) {
    const uintptr_t begin = r.begin.load(std::memory_order_acquire);
    if (begin != 0 && address >= begin && address < r.end.load(std::memory_order_acquire)) {
      [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, r.message, r.length);
      ::_exit(1);
    }
  }
  // Not ours: as if this handler had never been installed.
  if (g_previous_sigbus.sa_flags & SA_SIGINFO) {
    g_previous_sigbus.sa_sigaction(sig, info, context);
  } else if (g_previous_sigbus.sa_handler != SIG_DFL && g_previous_sigbus.sa_handler != SIG_IGN) {
    g_previous_sigbus.sa_handler(sig);
  } else if (g_previous_sigbus.sa_handler == SIG_DFL) {
    // Pending until this handler returns, then the default action (a fault would repeat too).
    ::signal(SIGBUS, SIG_DFL);
    ::raise(sig);
  }
}

void register_range(const void* data, int64_t size, const std::string& path) {
  std::lock_guard<std::mutex> lock(g_ranges_mutex);
  static bool installed = false;
  if (!installed) {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &g_previous_sigbus);
    installed = true;
  }
  for (MappedRange& r : g_ranges) {
    if (r.begin.load() != 0) continue;
    const std::string text = "\nerror: '" + path +
                             "' shrank while this process was reading it (truncated or rewritten in place): a file "
                             "a job reads must not change while the job runs; write a new file and rename it over "
                             "the old one, or stop the job first\n";
    r.length = std::min(text.size(), sizeof r.message);
    std::memcpy(r.message, text.data(), r.length);
    const auto begin = reinterpret_cast<uintptr_t>(data);
    // The lost pages fault from the page holding the file's new end: up to the mapping's.
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    r.end.store((begin + static_cast<uintptr_t>(size) + page - 1) / page * page, std::memory_order_release);
    r.begin.store(begin, std::memory_order_release);
    return;
  }
  // More live mappings than slots: this one is read unguarded (a SIGBUS then names nothing).
}

void unregister_range(const void* data) {
  std::lock_guard<std::mutex> lock(g_ranges_mutex);
  for (MappedRange& r : g_ranges) {
    if (r.begin.load() == reinterpret_cast<uintptr_t>(data)) r.begin.store(0, std::memory_order_release);
  }
}

}  // namespace

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
    register_range(data_, size_, path_);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) {
    unregister_range(data_);
    ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(size_));
  }
}

}  // namespace hyper_parallel::io
