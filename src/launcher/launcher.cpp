// launcher.cpp — argument parsing and the process supervisor of `hp-run`.
//
// The supervisor is single-threaded: one poll() loop watches every rank's
// stdout/stderr pipe plus a self-pipe that the signal handlers write to
// (SIGCHLD, SIGINT, SIGTERM), so child exits, signals and output are all
// handled in one place without races.
#include "launcher.h"
#include "hyper_parallel/core/rank_error_file.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sched.h>
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <climits>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <system_error>

extern char** environ;

namespace hyper_parallel::launcher {

// ---------------------------------------------------------------------------
// Argument parsing
// ---------------------------------------------------------------------------

namespace {

constexpr const char* kKnownOptions =
    "--nproc-per-node, --nnodes, --node-rank, --master-addr, --master-port, "
    "--timeout-on-failure, --threads-per-rank, --max-restarts, --help";

// torchrun spells its options with underscores; accept both spellings.
std::string canonical_option_name(std::string name) {
  for (char& c : name) {
    if (c == '_') c = '-';
  }
  return name;
}

int parse_int_option(const std::string& option, const std::string& text, long min_value, long max_value) {
  const bool looks_numeric = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) ||
                                               ((text[0] == '-' || text[0] == '+') && text.size() > 1));
  errno = 0;
  char* end = nullptr;
  const long value = looks_numeric ? std::strtol(text.c_str(), &end, 10) : 0;
  if (!looks_numeric || *end != '\0' || errno == ERANGE) {
    throw UsageError(option + " expects an integer, got '" + text + "'");
  }
  if (value < min_value || value > max_value) {
    throw UsageError(option + " expects an integer in [" + std::to_string(min_value) + ", " +
                     std::to_string(max_value) + "], got " + text);
  }
  return static_cast<int>(value);
}

double parse_seconds_option(const std::string& option, const std::string& text) {
  const bool looks_numeric = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.' ||
                                               text[0] == '-' || text[0] == '+');
  errno = 0;
  char* end = nullptr;
  const double value = looks_numeric ? std::strtod(text.c_str(), &end) : 0.0;
  if (!looks_numeric || *end != '\0' || errno == ERANGE || !std::isfinite(value) || value < 0.0) {
    throw UsageError(option + " expects a non-negative number of seconds, got '" + text + "'");
  }
  return value;
}

void validate(const LaunchOptions& o) {
  if (o.command.empty()) {
    throw UsageError("missing PROGRAM: expected 'hp-run [OPTIONS] PROGRAM [ARGS...]'");
  }
  if (o.node_rank >= o.nnodes) {
    throw UsageError("--node-rank must be less than --nnodes (" + std::to_string(o.nnodes) + "), got " +
                     std::to_string(o.node_rank));
  }
  if (o.max_restarts > 0 && o.nnodes > 1) {
    throw UsageError("--max-restarts " + std::to_string(o.max_restarts) + " with --nnodes " + std::to_string(o.nnodes) +
                     ": hp-run restarts the ranks of one node only (its static rendezvous has no round the nodes "
                     "agree on); across nodes use torchrun --max-restarts with --rdzv-backend c10d");
  }
  if (o.nnodes > 1 && o.master_port == 0) {
    throw UsageError(
        "--master-port is required when --nnodes is greater than 1 (got "
        "--nnodes " +
        std::to_string(o.nnodes) + "): every node must be told the same port");
  }
}

}  // namespace

LaunchOptions parse_arguments(const std::vector<std::string>& args) {
  LaunchOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      o.command.assign(args.begin() + static_cast<long>(i) + 1, args.end());
      break;
    }
    if (arg == "-h" || arg == "--help") {
      o.show_help = true;
      return o;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      // First non-option: PROGRAM. The rest is the program's, verbatim.
      o.command.assign(args.begin() + static_cast<long>(i), args.end());
      break;
    }
    if (arg.compare(0, 2, "--") != 0) {
      throw UsageError("unknown option '" + arg + "'; expected one of " + kKnownOptions + ", or PROGRAM");
    }
    const size_t eq = arg.find('=');
    const std::string spelled = arg.substr(0, eq);
    const std::string name = canonical_option_name(spelled);
    const bool known = name == "--nproc-per-node" || name == "--nnodes" || name == "--node-rank" ||
                       name == "--master-addr" || name == "--master-port" || name == "--timeout-on-failure" ||
                       name == "--threads-per-rank" || name == "--max-restarts";
    if (!known) {
      throw UsageError("unknown option '" + spelled + "'; expected one of " + kKnownOptions + ", or PROGRAM");
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw UsageError(spelled + " expects a value, but it is the last argument");
    }

    if (name == "--nproc-per-node") {
      o.nproc_per_node = parse_int_option(spelled, value, 1, 1 << 16);
    } else if (name == "--nnodes") {
      o.nnodes = parse_int_option(spelled, value, 1, 1 << 20);
    } else if (name == "--node-rank") {
      o.node_rank = parse_int_option(spelled, value, 0, (1 << 20) - 1);
    } else if (name == "--master-addr") {
      if (value.empty()) {
        throw UsageError(spelled + " expects a host name or address, got ''");
      }
      o.master_addr = value;
    } else if (name == "--max-restarts") {
      o.max_restarts = parse_int_option(spelled, value, 0, 1 << 20);
    } else if (name == "--master-port") {
      o.master_port = parse_int_option(spelled, value, 1, 65535);
    } else if (name == "--threads-per-rank") {
      if (value == "auto") {
        o.threads_per_rank = 0;
      } else {
        try {
          o.threads_per_rank = parse_int_option(spelled, value, 1, 1 << 16);
        } catch (const UsageError& e) {
          throw UsageError(std::string(e.what()) + " or 'auto'");
        }
      }
    } else {
      o.timeout_on_failure = parse_seconds_option(spelled, value);
    }
  }
  validate(o);
  return o;
}

LaunchOptions parse_arguments(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_arguments(args);
}

std::string usage_text() {
  return "usage: hp-run [OPTIONS] PROGRAM [ARGS...]\n"
         "\n"
         "Starts --nproc-per-node copies of PROGRAM on this node with the\n"
         "torch.distributed environment set (RANK, LOCAL_RANK, WORLD_SIZE,\n"
         "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT). Each output\n"
         "line is prefixed with '[rankK]: '. If one rank fails, the others are\n"
         "stopped and hp-run exits with that rank's status (or, while\n"
         "--max-restarts allows, starts all of them again). Each rank may write\n"
         "why it failed to the file named by HP_ERROR_FILE (hp-train does); the\n"
         "rank whose error came first is then named, even if a peer exited first.\n"
         "\n"
         "options (also accepted as --option=VALUE; options end at PROGRAM or --):\n"
         "  --nproc-per-node N        processes on this node (default 1)\n"
         "  --nnodes M                number of nodes (default 1)\n"
         "  --node-rank R             index of this node, 0..M-1 (default 0)\n"
         "  --master-addr HOST        address of rank 0 (default 127.0.0.1)\n"
         "  --master-port PORT        port of rank 0; required when M > 1,\n"
         "                            otherwise a free local port is chosen\n"
         "  --timeout-on-failure SEC  grace period between SIGTERM and SIGKILL\n"
         "                            when stopping the ranks (default 5)\n"
         "  --threads-per-rank N|auto intra-op threads of each rank (OMP_NUM_THREADS);\n"
         "                            auto: the usable cores / local ranks. Default,\n"
         "                            as torchrun: 1 when several ranks share the node\n"
         "                            and OMP_NUM_THREADS is unset\n"
         "  --max-restarts N          when a rank fails, stop the others and start all\n"
         "                            of them again, up to N times (default 0), as\n"
         "                            torchrun; each is told TORCHELASTIC_RESTART_COUNT.\n"
         "                            One node only (--nnodes 1)\n"
         "  -h, --help                print this help and exit\n"
         "\n"
         "exit status: 0 if all ranks succeed; the failed rank's exit status\n"
         "(1..127) or 128+signal; 128+signal if hp-run got SIGINT/SIGTERM;\n"
         "2 for a command-line error.\n";
}

// ---------------------------------------------------------------------------
// Small helpers shared by the supervisor and its tests
// ---------------------------------------------------------------------------

int pick_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    throw std::system_error(errno, std::generic_category(), "hp-run: socket() while choosing a master port");
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(0);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::system_error(err, std::generic_category(),
                            "hp-run: cannot bind 127.0.0.1:0 to choose a "
                            "master port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::vector<std::pair<std::string, std::string>> rank_environment(const LaunchOptions& o, int local_rank,
                                                                  int master_port, int restart_count) {
  return {
      {"RANK", std::to_string(o.node_rank * o.nproc_per_node + local_rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      // hp-run serves no store: rank 0 of the program does (an inherited True would
      // make every rank a client of a store nobody serves).
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
  };
}

RankThreads rank_threads(const LaunchOptions& o, const char* omp_num_threads, int usable_cores) {
  RankThreads t;
  if (o.threads_per_rank) {
    const bool automatic = *o.threads_per_rank == 0;
    t.omp_num_threads = automatic ? std::max(1, usable_cores / o.nproc_per_node) : *o.threads_per_rank;
    const int n = *t.omp_num_threads;
    t.message = "each of the " + std::to_string(o.nproc_per_node) + " local ranks runs " + std::to_string(n) +
                (n == 1 ? " intra-op thread" : " intra-op threads") + " (OMP_NUM_THREADS=" + std::to_string(n) +
                ", --threads-per-rank " +
                (automatic ? "auto: " + std::to_string(usable_cores) + " usable cores" : std::to_string(n)) + ")";
    if (omp_num_threads != nullptr)
      t.message += "; hp-run's OMP_NUM_THREADS=" + std::string(omp_num_threads) + " is not passed on";
  } else if (omp_num_threads == nullptr && o.nproc_per_node > 1) {
    t.omp_num_threads = 1;
    t.message = "OMP_NUM_THREADS is not set: each of the " + std::to_string(o.nproc_per_node) +
                " local ranks gets OMP_NUM_THREADS=1, as with torchrun, so that they do not oversubscribe the cores "
                "(choose with --threads-per-rank N|auto or OMP_NUM_THREADS)";
  }
  return t;
}

int usable_cores() {
#ifdef __linux__
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(std::min<long>(online, INT_MAX)) : 1;
}

std::string signal_name(int sig) {
  // Own table: strsignal() gives descriptions ("Killed"), not names, and
  // sigabbrev_np() is glibc-only.
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGCHLD:
      return "SIGCHLD";
    case SIGCONT:
      return "SIGCONT";
    case SIGSTOP:
      return "SIGSTOP";
    case SIGTSTP:
      return "SIGTSTP";
    case SIGTTIN:
      return "SIGTTIN";
    case SIGTTOU:
      return "SIGTTOU";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return "signal " + std::to_string(sig);
  }
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) {
    return "exited with status " + std::to_string(WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

int exit_code_for_wait_status(int status) {
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    return (code > 0 && code < 128) ? code : 1;
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// ---------------------------------------------------------------------------
// The supervisor
// ---------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

// Longest line kept waiting for its newline; beyond that it is emitted as it
// is, so a rank that never prints '\n' cannot exhaust hp-run's memory.
constexpr size_t kMaxPendingLine = 1 << 20;
constexpr size_t kReadChunk = size_t{64} * 1024;
constexpr size_t kMaxDrainReads = 256;

// Write end of the self-pipe; the only state the signal handler touches.
volatile sig_atomic_t g_wake_fd = -1;

extern "C" void hp_run_on_signal(int sig) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (g_wake_fd >= 0) {
    // Non-blocking: if the pipe is full, a wake-up is already pending.
    const ssize_t ignored = ::write(g_wake_fd, &byte, 1);
    (void)ignored;
  }
  errno = saved_errno;
}

void set_cloexec(int fd) { ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC); }

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// pipe() + close-on-exec on both ends, so one rank never inherits another
// rank's pipes (which would delay EOF).
void make_pipe(int fds[2]) {
  if (::pipe(fds) != 0) {
    throw std::system_error(errno, std::generic_category(), "pipe");
  }
  set_cloexec(fds[0]);
  set_cloexec(fds[1]);
}

// With fd 0/1/2 closed, new pipes could land on them and be clobbered by the
// dup2() calls in the child; occupy them with /dev/null first.
void ensure_standard_fds_open() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      const int opened = ::open("/dev/null", O_RDWR);
      if (opened >= 0 && opened != fd) {
        ::dup2(opened, fd);
        ::close(opened);
      }
    }
  }
}

// Installs the handlers and the self-pipe for the duration of launch(), and
// restores the previous dispositions afterwards.
class SignalScope {
 public:
  SignalScope() {
    make_pipe(pipe_);
    set_nonblocking(pipe_[0]);
    set_nonblocking(pipe_[1]);
    g_wake_fd = pipe_[1];

    struct sigaction action {};
    action.sa_handler = hp_run_on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &action, &old_int_);
    ::sigaction(SIGTERM, &action, &old_term_);
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;  // exits only, not stops
    ::sigaction(SIGCHLD, &action, &old_chld_);
    // A closed stdout must not kill the supervisor (and orphan the ranks);
    // writes then fail with EPIPE and are dropped.
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, &old_pipe_);
  }
  ~SignalScope() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGCHLD, &old_chld_, nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    g_wake_fd = -1;
    ::close(pipe_[0]);
    ::close(pipe_[1]);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  int read_fd() const { return pipe_[0]; }

 private:
  int pipe_[2] = {-1, -1};
  struct sigaction old_int_ {
  }, old_term_{}, old_chld_{}, old_pipe_{};
};

// Blocks the signals we handle while forking, so that the child cannot run
// our handler (and write into the parent's self-pipe) before it resets them.
class BlockHandledSignals {
 public:
  BlockHandledSignals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &set, &old_);
  }
  ~BlockHandledSignals() { ::sigprocmask(SIG_SETMASK, &old_, nullptr); }
  BlockHandledSignals(const BlockHandledSignals&) = delete;
  BlockHandledSignals& operator=(const BlockHandledSignals&) = delete;

 private:
  sigset_t old_;
};

// Writes all of `data`, retrying short writes; output to a destination that
// has gone away (EPIPE, EBADF, ...) is dropped.
void write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return;
    }
  }
}

void report(const std::string& line) { write_all(STDERR_FILENO, "hp-run: " + line + "\n"); }

bool succeeded(int wait_status) { return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0; }

// One of a rank's output pipes and the bytes after its last newline.
struct OutputStream {
  int fd = -1;      // read end; -1 once closed
  int target = -1;  // STDOUT_FILENO or STDERR_FILENO
  std::string pending;
};

struct Rank {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;  // also the process group id
  bool running = false;
  int wait_status = 0;       // once reaped
  int64_t reaped_at_ns = 0;  // CLOCK_REALTIME, as the error files' times
  std::string prefix;
  OutputStream out, err;
};

// Everything the child does between fork() and exec(). Only async-signal-safe
// calls: all allocation happened in the parent.
[[noreturn]] void exec_rank(char* const* argv, char** envp, pid_t parent, int stdin_fd, int stdout_fd, int stderr_fd) {
  // Own process group, so that signals to the rank reach its descendants.
  ::setpgid(0, 0);
#ifdef __linux__
  // Die with the supervisor, and close the race where it already died.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
#else
  (void)parent;
#endif
  // Ignored dispositions survive exec; the program gets the defaults.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  ::dup2(stdin_fd, STDIN_FILENO);
  ::dup2(stdout_fd, STDOUT_FILENO);
  ::dup2(stderr_fd, STDERR_FILENO);

  environ = envp;
  ::execvp(argv[0], argv);

  const int err = errno;
  char message[512];
  const int len =
      std::snprintf(message, sizeof(message), "hp-run: cannot execute '%s': %s\n", argv[0], std::strerror(err));
  if (len > 0) {
    const ssize_t ignored = ::write(STDERR_FILENO, message, std::min(static_cast<size_t>(len), sizeof(message) - 1));
    (void)ignored;
  }
  ::_exit(127);
}

class Supervisor {
 public:
  explicit Supervisor(const LaunchOptions& options) : options_(options) {}

  int run() {
    ensure_standard_fds_open();
    // Ranks get no terminal input: they sit in background process groups,
    // where reading the terminal would stop them with SIGTTIN.
    devnull_ = ::open("/dev/null", O_RDONLY);
    if (devnull_ < 0) {
      throw std::system_error(errno, std::generic_category(), "hp-run: cannot open /dev/null");
    }
    set_cloexec(devnull_);

    make_error_dir();
    threads_ = rank_threads(options_, std::getenv("OMP_NUM_THREADS"), usable_cores());
    if (!threads_.message.empty()) report(threads_.message);
    SignalScope signals;
    // torchrun's elastic agent: after a failure, all ranks are stopped and all started
    // again while restarts are left; an interrupted hp-run is not restarted.
    for (;; ++restart_count_) {
      // A chosen port is chosen afresh: the last group's rank 0 may still hold the old one.
      start_ranks(options_.master_port != 0 ? options_.master_port : pick_free_port());
      supervise(signals.read_fd());
      end_attempt();
      if (failure_exit_code_ == 0 || interrupt_signal_ != 0 || restart_count_ == options_.max_restarts) break;
      report("restarting all " + std::to_string(options_.nproc_per_node) + " ranks (restart " +
             std::to_string(restart_count_ + 1) + " of --max-restarts " + std::to_string(options_.max_restarts) +
             ") after: " + first_failure_);
      ranks_.clear();
      stopping_ = killed_ = false;
      failure_exit_code_ = 0;
      first_failure_.clear();
    }
    ::close(devnull_);
    if (!error_dir_.empty()) ::rmdir(error_dir_.c_str());
    return verdict();
  }

 private:
  void start_ranks(int port) {
    std::vector<char*> argv;
    for (const std::string& a : options_.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    ranks_.resize(static_cast<size_t>(options_.nproc_per_node));
    for (int local = 0; local < options_.nproc_per_node; ++local) {
      Rank& r = ranks_[static_cast<size_t>(local)];
      r.local_rank = local;
      r.rank = options_.node_rank * options_.nproc_per_node + local;
      r.prefix = "[rank" + std::to_string(r.rank) + "]: ";
      if (stopping_) continue;  // an earlier rank could not be started
      try {
        start_rank(r, argv, port);
      } catch (const std::system_error& e) {
        report("cannot start rank " + std::to_string(r.rank) + ": " + e.what() + stop_suffix());
        first_failure_ = "rank " + std::to_string(r.rank) + " could not be started";
        failure_exit_code_ = 1;
        begin_stopping(SIGTERM);
      }
    }
  }

  void start_rank(Rank& r, std::vector<char*>& argv, int port) {
    // The child's environment: ours minus the variables we set, then ours.
    std::vector<std::pair<std::string, std::string>> vars =
        rank_environment(options_, r.local_rank, port, restart_count_);
    if (!error_dir_.empty()) vars.emplace_back(kErrorFileVariable, error_file(r));
    if (threads_.omp_num_threads) vars.emplace_back("OMP_NUM_THREADS", std::to_string(*threads_.omp_num_threads));
    std::vector<std::string> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const std::string entry(*e);
      const std::string key = entry.substr(0, entry.find('='));
      bool overridden = false;
      for (const auto& kv : vars) overridden = overridden || kv.first == key;
      if (!overridden) env.push_back(entry);
    }
    for (const auto& kv : vars) env.push_back(kv.first + "=" + kv.second);
    std::vector<char*> envp;
    for (std::string& s : env) envp.push_back(&s[0]);
    envp.push_back(nullptr);

    int out[2];
    int err[2];
    make_pipe(out);
    try {
      make_pipe(err);
    } catch (...) {
      ::close(out[0]);
      ::close(out[1]);
      throw;
    }

    const pid_t parent = ::getpid();
    pid_t pid;
    int fork_errno = 0;
    {
      BlockHandledSignals blocked;
      pid = ::fork();
      fork_errno = errno;
      if (pid == 0) exec_rank(argv.data(), envp.data(), parent, devnull_, out[1], err[1]);
      if (pid > 0) {
        // Also from the parent, so the group exists before we may signal it.
        ::setpgid(pid, pid);
      }
    }
    ::close(out[1]);
    ::close(err[1]);
    if (pid < 0) {
      ::close(out[0]);
      ::close(err[0]);
      throw std::system_error(fork_errno, std::generic_category(), "fork");
    }
    set_nonblocking(out[0]);
    set_nonblocking(err[0]);
    r.pid = pid;
    r.running = true;
    r.out = OutputStream{out[0], STDOUT_FILENO, {}};
    r.err = OutputStream{err[0], STDERR_FILENO, {}};
  }

  bool any_running() const {
    for (const Rank& r : ranks_) {
      if (r.running) return true;
    }
    return false;
  }

  void supervise(int wake_fd) {
    std::vector<pollfd> fds;
    std::vector<OutputStream*> streams;  // parallel to fds[1..]
    std::vector<Rank*> owners;
    while (any_running()) {
      fds.assign(1, pollfd{wake_fd, POLLIN, 0});
      streams.clear();
      owners.clear();
      for (Rank& r : ranks_) {
        for (OutputStream* s : {&r.out, &r.err}) {
          if (s->fd < 0) continue;
          fds.push_back(pollfd{s->fd, POLLIN, 0});
          streams.push_back(s);
          owners.push_back(&r);
        }
      }

      int timeout_ms = -1;
      if (stopping_ && !killed_) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_deadline_ - Clock::now());
        timeout_ms = static_cast<int>(std::max<long long>(0, left.count() + 1));
      }
      const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) {
        throw std::system_error(errno, std::generic_category(), "poll");
      }

      if (ready > 0) {
        if (fds[0].revents != 0) handle_wake_bytes(wake_fd);
        for (size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents != 0) pump(*owners[i - 1], *streams[i - 1], false);
        }
      }
      reap();
      if (stopping_ && !killed_ && Clock::now() >= kill_deadline_) {
        escalate_to_sigkill();
      }
    }
  }

  void handle_wake_bytes(int wake_fd) {
    unsigned char bytes[64];
    ssize_t n;
    while ((n = ::read(wake_fd, bytes, sizeof(bytes))) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        const int sig = bytes[i];
        if (sig == SIGINT || sig == SIGTERM) on_termination_request(sig);
        // SIGCHLD needs nothing here: reap() runs after every wake-up.
      }
    }
  }

  void on_termination_request(int sig) {
    if (stopping_) {
      // Asked again while already stopping: stop waiting politely.
      report("received " + signal_name(sig) + " again; killing all ranks with SIGKILL");
      escalate_to_sigkill();
      return;
    }
    if (interrupt_signal_ == 0) interrupt_signal_ = sig;
    report("received " + signal_name(sig) + "; forwarding it to all ranks");
    begin_stopping(sig);
  }

  void begin_stopping(int sig) {
    stopping_ = true;
    // Capped so the deadline cannot overflow the clock's representation.
    const double grace_s = std::min(options_.timeout_on_failure, 1e6);
    kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));
    signal_running_ranks(sig);
  }

  void escalate_to_sigkill() {
    killed_ = true;
    std::string still;
    for (const Rank& r : ranks_) {
      if (r.running) still += (still.empty() ? "" : ", ") + std::to_string(r.rank);
    }
    if (!still.empty()) {
      char grace[32];
      std::snprintf(grace, sizeof(grace), "%g", options_.timeout_on_failure);
      report("rank(s) " + still + " still running " + grace + " s after being asked to stop; sending SIGKILL");
    }
    signal_running_ranks(SIGKILL);
  }

  void signal_running_ranks(int sig) {
    for (const Rank& r : ranks_) {
      if (r.running) ::kill(-r.pid, sig);
    }
  }

  // Moves available bytes from a pipe to our stdout/stderr as prefixed
  // complete lines. Without `drain`, one read (the pipe was reported
  // readable). With `drain`, used once the rank has exited and everything it
  // wrote is already in the pipe: read until the pipe is empty, then close it
  // even if a lingering descendant still holds the write end.
  void pump(const Rank& r, OutputStream& s, bool drain) {
    char buffer[kReadChunk];
    // Bounded, so a descendant that keeps writing cannot stall the loop.
    for (size_t reads = 0; reads < kMaxDrainReads; ++reads) {
      const ssize_t n = ::read(s.fd, buffer, sizeof(buffer));
      if (n > 0) {
        emit_lines(r, s, buffer, static_cast<size_t>(n));
        if (drain) continue;
        return;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN && !drain) return;
      break;  // EOF, a read error, or drained
    }
    if (!s.pending.empty()) {  // the unterminated last line
      write_all(s.target, r.prefix + s.pending + "\n");
      s.pending.clear();
    }
    ::close(s.fd);
    s.fd = -1;
  }

  void emit_lines(const Rank& r, OutputStream& s, const char* data, size_t n) {
    s.pending.append(data, n);
    std::string out;
    size_t start = 0;
    for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      out += r.prefix;
      out.append(s.pending, start, nl + 1 - start);
    }
    s.pending.erase(0, start);
    if (s.pending.size() >= kMaxPendingLine) {
      out += r.prefix + s.pending + "\n";
      s.pending.clear();
    }
    // One write per batch of whole lines: lines from different ranks never
    // interleave mid-line.
    if (!out.empty()) write_all(s.target, out);
  }

  void reap() {
    for (Rank& r : ranks_) {
      if (!r.running) continue;
      int status = 0;
      pid_t got;
      do {
        got = ::waitpid(r.pid, &status, WNOHANG);
      } while (got < 0 && errno == EINTR);
      if (got == 0) continue;
      r.running = false;
      if (got < 0) continue;  // not our child any more; nothing to report
      r.wait_status = status;
      r.reaped_at_ns = unix_time_ns();
      // Its output first, so a rank's last words precede the verdict.
      if (r.out.fd >= 0) pump(r, r.out, true);
      if (r.err.fd >= 0) pump(r, r.err, true);
      const bool failed = !succeeded(status);
      if (failed && !stopping_) {
        const std::string what = describe_wait_status(status);
        first_failure_ = "rank " + std::to_string(r.rank) + " " + what;
        failure_exit_code_ = exit_code_for_wait_status(status);
        report("rank " + std::to_string(r.rank) + " (local rank " + std::to_string(r.local_rank) + ", pid " +
               std::to_string(r.pid) + ") " + what + stop_suffix());
        begin_stopping(SIGTERM);
      }
    }
  }

  std::string stop_suffix() const { return any_running() ? "; stopping the other ranks" : ""; }

  // After the ranks of one attempt have exited: nothing of them may outlive it, and a
  // failure is blamed on its cause before their error files are cleared for the next.
  void end_attempt() {
    // Descendants left in the ranks' process groups would be orphans
    // (possibly holding GPU memory); nothing of a finished job may outlive it.
    for (Rank& r : ranks_) {
      if (r.pid > 0) ::kill(-r.pid, SIGKILL);
      for (OutputStream* s : {&r.out, &r.err}) {
        if (s->fd >= 0) {
          ::close(s->fd);
          s->fd = -1;
        }
      }
    }
    if (failure_exit_code_ != 0) name_the_cause();
    remove_error_files();
  }

  int verdict() const {
    if (failure_exit_code_ != 0) {
      report("FAILED: " + first_failure_ +
             (options_.max_restarts > 0 && interrupt_signal_ == 0
                  ? " (no restart left: --max-restarts " + std::to_string(options_.max_restarts) + ")"
                  : ""));
      return failure_exit_code_;
    }
    if (interrupt_signal_ != 0) {
      report("stopped by " + signal_name(interrupt_signal_));
      return 128 + interrupt_signal_;
    }
    return 0;
  }

  // The ranks' error files (rank_error_file.h) live in a fresh folder of $TMPDIR, removed
  // at the end. Without one (TMPDIR not writable) the first rank to exit is named.
  void make_error_dir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/hp-run-errors-XXXXXX";
    if (::mkdtemp(&pattern[0])) error_dir_ = pattern;
  }

  std::string error_file(const Rank& r) const { return error_dir_ + "/rank-" + std::to_string(r.rank); }

  void remove_error_files() {
    if (error_dir_.empty()) return;
    for (const Rank& r : ranks_) {
      ::unlink(error_file(r).c_str());
      ::unlink((error_file(r) + ".tmp").c_str());
    }
  }

  // After a failure: the rank whose error came first is the cause, even when a peer
  // exited before it (it died of the disconnect while the cause was tearing down). A
  // failed rank without an error file (a crash) is dated by when hp-run reaped it, as
  // torchrun does. An error that only reports another rank's failure (kPeerCauseLine)
  // is the cause only when no rank recorded its own. The verdict and the exit status
  // become the cause's.
  void name_the_cause() {
    if (error_dir_.empty()) return;
    const Rank* cause = nullptr;
    RankError first;
    bool recorded = false;  // the cause wrote an error file
    auto before = [&](const RankError& e) {
      if (!cause) return true;
      if (e.caused_by_peer != first.caused_by_peer) return first.caused_by_peer;  // own errors first
      return e.unix_time_ns < first.unix_time_ns;
    };
    int64_t earliest_ns = INT64_MAX;  // of any error, a peer's echo included
    for (const Rank& r : ranks_) {
      if (r.pid <= 0 || r.running) continue;
      std::optional<RankError> e = read_rank_error_file(error_file(r));
      if (!e && !succeeded(r.wait_status)) e = RankError{r.reaped_at_ns, ""};
      if (e) earliest_ns = std::min(earliest_ns, e->unix_time_ns);
      if (e && before(*e)) {
        first = *e;
        cause = &r;
        recorded = !e->message.empty();
      }
    }
    if (!cause || !recorded) return;  // no cause, or a crash: the first to exit is named
    std::string message = first.message.substr(0, first.message.find('\n'));
    if (message.size() > 500) message = message.substr(0, 500) + " ...";
    const std::string rank = "rank " + std::to_string(cause->rank);
    if (first_failure_.rfind(rank + " ", 0) == 0) {  // the first to exit, as well
      first_failure_ += ": " + message;
      return;
    }
    report(rank +
           (first.unix_time_ns <= earliest_ns ? "'s error was recorded first; "
                                              : "'s own error is the cause (earlier errors only report it); ") +
           first_failure_ + " before it, failing after it");
    if (WIFEXITED(cause->wait_status) && WEXITSTATUS(cause->wait_status) != 0) {
      first_failure_ = rank + " " + describe_wait_status(cause->wait_status) + ": " + message;
      failure_exit_code_ = exit_code_for_wait_status(cause->wait_status);
    } else {  // still tearing down when hp-run stopped it: its status is hp-run's doing
      first_failure_ =
          rank + ": " + message + " (then stopped by hp-run: " + describe_wait_status(cause->wait_status) + ")";
    }
  }

  const LaunchOptions& options_;
  std::vector<Rank> ranks_;
  std::string error_dir_;
  int devnull_ = -1;
  RankThreads threads_;  // what each rank gets as OMP_NUM_THREADS (--threads-per-rank)
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_deadline_{};
  int interrupt_signal_ = 0;
  int restart_count_ = 0;  // restarts of the group so far (TORCHELASTIC_RESTART_COUNT)
  int failure_exit_code_ = 0;
  std::string first_failure_;
};

}  // namespace

int launch(const LaunchOptions& options) {
  validate(options);
  return Supervisor(options).run();
}

}  // namespace hyper_parallel::launcher
