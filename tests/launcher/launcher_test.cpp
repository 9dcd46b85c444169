// launcher_test.cpp — tests of `hp-run`, the torchrun-like launcher.
//
// The parser and the small helpers are tested directly through the
// hp_launcher library; the supervisor is tested end to end by running the
// real hp-run binary (HP_RUN_PATH) on `sh -c` programs and checking its
// output, exit code, timing and that no rank outlives it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "launcher.h"

#ifndef HP_RUN_PATH
#error "HP_RUN_PATH must name the hp-run executable under test"
#endif

extern char** environ;

namespace hl = hyper_parallel::launcher;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// True once `pid` no longer runs. A zombie counts as gone: once hp-run is
// killed, its orphans are re-parented to a process that may never reap them.
bool process_is_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = content.rfind(')');
  return paren != std::string::npos && paren + 2 < content.size() && content[paren + 2] == 'Z';
}

bool wait_until_gone(pid_t pid, double timeout_s) {
  const auto start = Clock::now();
  while (!process_is_gone(pid)) {
    if (seconds_since(start) > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

struct Outcome {
  int exit_code = -1;  // -1 if hp-run was killed by a signal
  int term_signal = 0;
  std::string out;
  std::string err;
  double seconds = 0.0;
};

// A running hp-run with its stdout and stderr captured through pipes.
class HpRun {
 public:
  explicit HpRun(const std::vector<std::string>& args) : start_(Clock::now()) {
    int out[2];
    int err[2];
    EXPECT_EQ(::pipe(out), 0);
    EXPECT_EQ(::pipe(err), 0);
    for (int fd : {out[0], out[1], err[0], err[1]}) ::fcntl(fd, F_SETFD, FD_CLOEXEC);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
    // hp-run must start with default signal handling whatever ours is.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults;
    sigemptyset(&defaults);
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD}) sigaddset(&defaults, sig);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

    std::vector<std::string> full{HP_RUN_PATH};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : full) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, HP_RUN_PATH, &actions, &attr, argv.data(), environ);
    EXPECT_EQ(rc, 0) << "cannot start " << HP_RUN_PATH;
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

  ~HpRun() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      int status;
      ::waitpid(pid_, &status, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }

  pid_t pid() const { return pid_; }
  const std::string& out() const { return outcome_.out; }

  // Reads output until `done(stdout so far)` holds; false on timeout or EOF.
  bool wait_for_stdout(const std::function<bool(const std::string&)>& done, double timeout_s) {
    const auto start = Clock::now();
    while (!done(outcome_.out)) {
      const double left = timeout_s - seconds_since(start);
      if (left <= 0 || !read_some(left)) return done(outcome_.out);
    }
    return true;
  }

  void send(int sig) { ::kill(pid_, sig); }

  // Collects the rest of the output and the exit status. If hp-run does not
  // finish within `timeout_s`, it is killed and the test fails.
  Outcome finish(double timeout_s = 20.0) {
    const auto start = Clock::now();
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      const double left = timeout_s - seconds_since(start);
      if (left <= 0) break;
      read_some(left);
    }
    int status = 0;
    for (;;) {
      const pid_t got = ::waitpid(pid_, &status, WNOHANG);
      if (got == pid_) break;
      if (seconds_since(start) > timeout_s) {
        ADD_FAILURE() << "hp-run did not finish within " << timeout_s << " s";
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    reaped_ = true;
    outcome_.seconds = seconds_since(start_);
    if (WIFEXITED(status)) outcome_.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) outcome_.term_signal = WTERMSIG(status);
    return outcome_;
  }

 private:
  // One poll() round over the open pipes; false once both are closed.
  bool read_some(double timeout_s) {
    std::vector<pollfd> fds;
    if (out_fd_ >= 0) fds.push_back({out_fd_, POLLIN, 0});
    if (err_fd_ >= 0) fds.push_back({err_fd_, POLLIN, 0});
    if (fds.empty()) return false;
    if (::poll(fds.data(), fds.size(), static_cast<int>(timeout_s * 1000) + 1) <= 0) {
      return true;
    }
    for (const pollfd& p : fds) {
      if (p.revents == 0) continue;
      int& fd = p.fd == out_fd_ ? out_fd_ : err_fd_;
      std::string& sink = p.fd == out_fd_ ? outcome_.out : outcome_.err;
      char buffer[65536];
      const ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n > 0) {
        sink.append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fd);
        fd = -1;
      }
    }
    return true;
  }

  Clock::time_point start_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int out_fd_ = -1;
  int err_fd_ = -1;
  Outcome outcome_;
};

Outcome run_hp(const std::vector<std::string>& args, double timeout_s = 20.0) {
  HpRun run(args);
  return run.finish(timeout_s);
}

// hp-run arguments that start `ranks` copies of `sh -c script`.
std::vector<std::string> sh_ranks(int ranks, const std::string& script, std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"--nproc-per-node", std::to_string(ranks)};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {"sh", "-c", script});
  return args;
}

// Splits "[rankK]: rest" lines into K -> rests; fails on any other line.
std::map<int, std::vector<std::string>> by_rank(const std::string& text) {
  std::map<int, std::vector<std::string>> result;
  for (const std::string& line : lines_of(text)) {
    const size_t close = line.find("]: ");
    const std::string digits =
        line.rfind("[rank", 0) == 0 && close != std::string::npos ? line.substr(5, close - 5) : "";
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
      ADD_FAILURE() << "line without a rank prefix: '" << line << "'";
      continue;
    }
    result[std::stoi(digits)].push_back(line.substr(close + 3));
  }
  return result;
}

constexpr const char* kPrintEnvironment =
    "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK "
    "$MASTER_ADDR $MASTER_PORT";

// Checks the output of kPrintEnvironment for ranks first_rank.. and returns
// the MASTER_PORT every rank saw (they must agree).
std::string check_environment_lines(const Outcome& o, int local_ranks, int first_rank, int world_size, int group_rank) {
  const auto ranks = by_rank(o.out);
  EXPECT_EQ(ranks.size(), static_cast<size_t>(local_ranks)) << o.out;
  std::string port;
  for (int local = 0; local < local_ranks; ++local) {
    const int rank = first_rank + local;
    const auto it = ranks.find(rank);
    if (it == ranks.end() || it->second.size() != 1) {
      ADD_FAILURE() << "expected exactly one line from [rank" << rank << "], got:\n" << o.out;
      continue;
    }
    std::istringstream fields(it->second[0]);
    std::string r, lr, ws, lws, gr, addr, p;
    fields >> r >> lr >> ws >> lws >> gr >> addr >> p;
    EXPECT_EQ(r, std::to_string(rank));
    EXPECT_EQ(lr, std::to_string(local));
    EXPECT_EQ(ws, std::to_string(world_size));
    EXPECT_EQ(lws, std::to_string(local_ranks));
    EXPECT_EQ(gr, std::to_string(group_rank));
    EXPECT_EQ(addr, "127.0.0.1");
    if (port.empty()) port = p;
    EXPECT_EQ(p, port) << "all ranks must see the same MASTER_PORT";
  }
  return port;
}

}  // namespace

// ---------------------------------------------------------------------------
// The argument parser
// ---------------------------------------------------------------------------

TEST(Launcher, ParserDefaultsToOneLocalProcessOnOneNode) {
  const hl::LaunchOptions o = hl::parse_arguments({"prog"});
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 0);
  EXPECT_DOUBLE_EQ(o.timeout_on_failure, 5.0);
  EXPECT_FALSE(o.show_help);
  EXPECT_EQ(o.command, std::vector<std::string>{"prog"});
}

TEST(Launcher, ParserAcceptsSeparateAndEqualsValues) {
  const hl::LaunchOptions o =
      hl::parse_arguments({"--nproc-per-node", "4", "--nnodes=3", "--node-rank", "2", "--master-addr=10.0.0.1",
                           "--master-port", "29500", "--timeout-on-failure=0.5", "train", "x"});
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_DOUBLE_EQ(o.timeout_on_failure, 0.5);
  EXPECT_EQ(o.command, (std::vector<std::string>{"train", "x"}));
}

TEST(Launcher, ParserAcceptsTorchrunUnderscoreSpellings) {
  const hl::LaunchOptions o = hl::parse_arguments({"--nproc_per_node=2", "--master_port", "1234", "p"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.master_port, 1234);
}

TEST(Launcher, ParserStopsAtProgramAndPassesItsArgumentsVerbatim) {
  const hl::LaunchOptions o =
      hl::parse_arguments({"--nproc-per-node", "2", "python", "--nproc-per-node", "7", "--bogus", "--", "-x"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.command, (std::vector<std::string>{"python", "--nproc-per-node", "7", "--bogus", "--", "-x"}));
}

TEST(Launcher, ParserTreatsDoubleDashAsEndOfOptions) {
  const hl::LaunchOptions o = hl::parse_arguments({"--nnodes", "1", "--", "--odd-program", "a"});
  EXPECT_EQ(o.command, (std::vector<std::string>{"--odd-program", "a"}));
}

TEST(Launcher, ParserRecognizesHelpWithoutRequiringProgram) {
  EXPECT_TRUE(hl::parse_arguments({"--help"}).show_help);
  EXPECT_TRUE(hl::parse_arguments({"--nproc-per-node", "2", "-h"}).show_help);
  EXPECT_TRUE(contains(hl::usage_text(), "--nproc-per-node"));
}

// Expects parse_arguments(args) to throw a UsageError mentioning every needle.
static void expect_usage_error(const std::vector<std::string>& args, const std::vector<std::string>& needles) {
  try {
    hl::parse_arguments(args);
    ADD_FAILURE() << "expected a UsageError";
  } catch (const hl::UsageError& e) {
    for (const std::string& needle : needles) {
      EXPECT_TRUE(contains(e.what(), needle)) << "'" << e.what() << "' lacks '" << needle << "'";
    }
  }
}

TEST(Launcher, ParserRejectsMissingProgram) {
  expect_usage_error({}, {"PROGRAM"});
  expect_usage_error({"--nproc-per-node", "2"}, {"PROGRAM"});
  expect_usage_error({"--nproc-per-node", "2", "--"}, {"PROGRAM"});
}

TEST(Launcher, ParserRejectsUnknownOptionNamingIt) {
  expect_usage_error({"--bogus", "p"}, {"'--bogus'", "--nproc-per-node"});
  expect_usage_error({"--bogus=3", "p"}, {"'--bogus'"});
  expect_usage_error({"-n", "2", "p"}, {"'-n'"});
}

TEST(Launcher, ParserRejectsNonNumericAndOutOfRangeValues) {
  expect_usage_error({"--nproc-per-node", "abc", "p"}, {"--nproc-per-node", "integer", "'abc'"});
  expect_usage_error({"--nproc-per-node=2x", "p"}, {"--nproc-per-node", "'2x'"});
  expect_usage_error({"--nproc-per-node", "0", "p"}, {"--nproc-per-node", "0"});
  expect_usage_error({"--nproc-per-node", " 2", "p"}, {"--nproc-per-node"});
  expect_usage_error({"--master-port", "70000", "p"}, {"--master-port", "70000"});
  expect_usage_error({"--timeout-on-failure", "-1", "p"}, {"--timeout-on-failure", "'-1'"});
  expect_usage_error({"--timeout-on-failure", "soon", "p"}, {"--timeout-on-failure"});
}

TEST(Launcher, ParserRejectsOptionWithoutValue) {
  expect_usage_error({"--nproc-per-node"}, {"--nproc-per-node", "expects a value"});
}

TEST(Launcher, ParserRequiresMasterPortForMultipleNodes) {
  expect_usage_error({"--nnodes", "2", "--node-rank", "1", "p"}, {"--master-port", "--nnodes"});
  EXPECT_NO_THROW(hl::parse_arguments({"--nnodes", "2", "--master-port", "5", "p"}));
}

TEST(Launcher, ParserReadsMaxRestartsForOneNodeOnly) {
  EXPECT_EQ(hl::parse_arguments({"prog"}).max_restarts, 0);
  EXPECT_EQ(hl::parse_arguments({"--max-restarts", "3", "prog"}).max_restarts, 3);
  EXPECT_EQ(hl::parse_arguments({"--max_restarts=1", "prog"}).max_restarts, 1);
  expect_usage_error({"--max-restarts", "-1", "p"}, {"--max-restarts", "-1"});
  // Across nodes the rendezvous has no round the nodes agree on: torchrun's c10d one does.
  expect_usage_error({"--max-restarts", "1", "--nnodes", "2", "--master-port", "5", "p"},
                     {"--max-restarts 1", "--nnodes 2", "torchrun", "--rdzv-backend c10d"});
}

TEST(Launcher, ParserRejectsNodeRankOutsideNodeCount) {
  expect_usage_error({"--nnodes", "2", "--node-rank", "2", "--master-port", "5", "p"}, {"--node-rank", "--nnodes"});
}

// ---------------------------------------------------------------------------
// Helpers of the library
// ---------------------------------------------------------------------------

TEST(Launcher, RankEnvironmentOffsetsRanksByNodeRank) {
  hl::LaunchOptions o;
  o.nproc_per_node = 4;
  o.nnodes = 3;
  o.node_rank = 2;
  o.master_addr = "host";
  const auto env = hl::rank_environment(o, 1, 777);
  const std::map<std::string, std::string> vars(env.begin(), env.end());
  EXPECT_EQ(vars.at("RANK"), "9");
  EXPECT_EQ(vars.at("LOCAL_RANK"), "1");
  EXPECT_EQ(vars.at("WORLD_SIZE"), "12");
  EXPECT_EQ(vars.at("LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(vars.at("GROUP_RANK"), "2");
  EXPECT_EQ(vars.at("MASTER_ADDR"), "host");
  EXPECT_EQ(vars.at("MASTER_PORT"), "777");
  EXPECT_EQ(vars.at("TORCHELASTIC_RESTART_COUNT"), "0");
  EXPECT_EQ(vars.at("TORCHELASTIC_MAX_RESTARTS"), "0");
  EXPECT_EQ(vars.at("TORCHELASTIC_USE_AGENT_STORE"), "False");  // rank 0 serves the store, not hp-run
}

TEST(Launcher, RankEnvironmentCountsRestartsAsTorchrun) {
  hl::LaunchOptions o;
  o.max_restarts = 3;
  const auto env = hl::rank_environment(o, 0, 777, 2);
  const std::map<std::string, std::string> vars(env.begin(), env.end());
  EXPECT_EQ(vars.at("TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(vars.at("TORCHELASTIC_MAX_RESTARTS"), "3");
}

TEST(Launcher, ParserReadsThreadsPerRankAsACountOrAuto) {
  EXPECT_FALSE(hl::parse_arguments({"prog"}).threads_per_rank.has_value());
  EXPECT_EQ(hl::parse_arguments({"--threads-per-rank", "3", "prog"}).threads_per_rank, 3);
  EXPECT_EQ(hl::parse_arguments({"--threads_per_rank=auto", "prog"}).threads_per_rank, 0);
  expect_usage_error({"--threads-per-rank", "0", "p"}, {"--threads-per-rank", "auto", "0"});
  expect_usage_error({"--threads-per-rank", "two", "p"}, {"--threads-per-rank", "auto", "two"});
}

// torchrun's rule when nothing is chosen: one intra-op thread per rank when several share
// the node and OMP_NUM_THREADS is unset (LibTorch's default, one thread per core in every
// rank, oversubscribes the cores). A choice on the command line wins over the variable.
TEST(Launcher, IntraOpThreadsPerRankFollowTorchrunUnlessChosen) {
  hl::LaunchOptions o;
  o.nproc_per_node = 2;
  hl::RankThreads t = hl::rank_threads(o, nullptr, 16);
  EXPECT_EQ(t.omp_num_threads, 1);
  EXPECT_NE(t.message.find("OMP_NUM_THREADS=1"), std::string::npos) << t.message;
  EXPECT_NE(t.message.find("--threads-per-rank"), std::string::npos) << t.message;

  t = hl::rank_threads(o, "4", 16);  // the user's variable is left alone, silently
  EXPECT_FALSE(t.omp_num_threads.has_value());
  EXPECT_EQ(t.message, "");

  o.nproc_per_node = 1;  // one rank may use every core, as with torchrun
  t = hl::rank_threads(o, nullptr, 16);
  EXPECT_FALSE(t.omp_num_threads.has_value());
  EXPECT_EQ(t.message, "");

  o.nproc_per_node = 3;
  o.threads_per_rank = 0;  // auto: the usable cores split between the local ranks
  t = hl::rank_threads(o, nullptr, 16);
  EXPECT_EQ(t.omp_num_threads, 5);
  EXPECT_NE(t.message.find("5 intra-op threads"), std::string::npos) << t.message;
  EXPECT_EQ(hl::rank_threads(o, nullptr, 2).omp_num_threads, 1);  // never 0

  o.threads_per_rank = 7;  // an explicit count wins over the variable, and says so
  t = hl::rank_threads(o, "4", 16);
  EXPECT_EQ(t.omp_num_threads, 7);
  EXPECT_NE(t.message.find("OMP_NUM_THREADS=4"), std::string::npos) << t.message;
}

TEST(Launcher, WaitStatusesAreDescribedAndMappedToExitCodes) {
  // Real statuses, from children that exit or are killed.
  auto status_of = [](const char* script) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", script, static_cast<char*>(nullptr));
      ::_exit(126);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  };
  const int exited3 = status_of("exit 3");
  EXPECT_EQ(hl::describe_wait_status(exited3), "exited with status 3");
  EXPECT_EQ(hl::exit_code_for_wait_status(exited3), 3);
  const int killed = status_of("kill -KILL $$");
  EXPECT_EQ(hl::describe_wait_status(killed), "killed by signal 9 (SIGKILL)");
  EXPECT_EQ(hl::exit_code_for_wait_status(killed), 137);
  EXPECT_EQ(hl::exit_code_for_wait_status(status_of("exit 200")), 1);
  EXPECT_EQ(hl::signal_name(SIGTERM), "SIGTERM");
}

TEST(Launcher, PickFreePortReturnsAUsablePort) {
  const int port = hl::pick_free_port();
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
}

// ---------------------------------------------------------------------------
// The hp-run binary
// ---------------------------------------------------------------------------

TEST(Launcher, TwoRanksSeeTheirEnvironmentAndAChosenPort) {
  const Outcome o = run_hp(sh_ranks(2, kPrintEnvironment));
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(contains(o.out, "[rank0]: 0 0 2 2 0 127.0.0.1 ")) << o.out;
  EXPECT_TRUE(contains(o.out, "[rank1]: 1 1 2 2 0 127.0.0.1 ")) << o.out;
  const std::string port = check_environment_lines(o, 2, 0, 2, 0);
  ASSERT_FALSE(port.empty());
  EXPECT_EQ(port.find_first_not_of("0123456789"), std::string::npos) << port;
  EXPECT_GT(std::stoi(port), 0);
}

TEST(Launcher, FourRanksEachGetTheirOwnRank) {
  const Outcome o = run_hp(sh_ranks(4, kPrintEnvironment));
  EXPECT_EQ(o.exit_code, 0) << o.err;
  check_environment_lines(o, 4, 0, 4, 0);
}

TEST(Launcher, SecondNodeRanksAreOffsetByNodeRank) {
  const Outcome o =
      run_hp(sh_ranks(2, kPrintEnvironment, {"--nnodes", "2", "--node-rank", "1", "--master-port", "29555"}));
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(check_environment_lines(o, 2, 2, 4, 1), "29555");
}

TEST(Launcher, ExplicitMasterPortAndAddressArePassedThrough) {
  const Outcome o =
      run_hp({"--master-port=4321", "--master-addr", "127.0.0.1", "sh", "-c", "echo $MASTER_ADDR:$MASTER_PORT"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "[rank0]: 127.0.0.1:4321\n");
}

// One variable of hp-run's own environment (it inherits this process's) for one scope;
// a null value unsets it.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const char* value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value != nullptr) {
      ::setenv(name_.c_str(), value, 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

TEST(Launcher, RanksSharingANodeGetOneIntraOpThreadEachAndAreToldOnce) {
  const char* script = "echo threads=${OMP_NUM_THREADS:-unset}";
  {
    ScopedEnv unset("OMP_NUM_THREADS", nullptr);
    const Outcome o = run_hp(sh_ranks(2, script));
    EXPECT_EQ(o.exit_code, 0) << o.err;
    EXPECT_TRUE(contains(o.out, "[rank0]: threads=1\n")) << o.out;
    EXPECT_TRUE(contains(o.out, "[rank1]: threads=1\n")) << o.out;
    const size_t first = o.err.find("OMP_NUM_THREADS=1");
    EXPECT_NE(first, std::string::npos) << o.err;
    EXPECT_EQ(o.err.find("OMP_NUM_THREADS=1", first + 1), std::string::npos) << "said more than once: " << o.err;

    const Outcome chosen = run_hp(sh_ranks(2, script, {"--threads-per-rank", "3"}));
    EXPECT_EQ(chosen.exit_code, 0) << chosen.err;
    EXPECT_TRUE(contains(chosen.out, "[rank1]: threads=3\n")) << chosen.out;

    const Outcome one = run_hp({"sh", "-c", script});
    EXPECT_EQ(one.out, "[rank0]: threads=unset\n");
  }
  ScopedEnv set("OMP_NUM_THREADS", "2");
  const Outcome o = run_hp(sh_ranks(2, script));
  EXPECT_TRUE(contains(o.out, "[rank1]: threads=2\n")) << o.out;
  EXPECT_EQ(o.err.find("OMP_NUM_THREADS"), std::string::npos) << o.err;
}

TEST(Launcher, FailingRankStopsTheOthersAndPropagatesItsExitStatus) {
  const Outcome o = run_hp(sh_ranks(4, "if [ \"$RANK\" = 2 ]; then echo bye >&2; exit 3; fi; exec sleep 60"));
  EXPECT_LT(o.seconds, 10.0);
  EXPECT_EQ(o.exit_code, 3) << o.err;
  EXPECT_TRUE(contains(o.err, "[rank2]: bye\n")) << o.err;
  EXPECT_TRUE(contains(o.err, "hp-run: rank 2 (local rank 2, pid ")) << o.err;
  EXPECT_TRUE(contains(o.err, "exited with status 3; stopping the other ranks")) << o.err;
  EXPECT_TRUE(contains(o.err, "hp-run: FAILED: rank 2 exited with status 3")) << o.err;
  // The rank's own last words come before the verdict.
  EXPECT_LT(o.err.find("[rank2]: bye"), o.err.find("hp-run: rank 2"));
}

// torchrun's elastic agent: a failed rank stops the whole group, which is started again
// with TORCHELASTIC_RESTART_COUNT one higher. Rank 1 fails in attempts 0 and 1 while
// rank 0 would sleep for a minute; attempt 2 succeeds.
TEST(Launcher, AFailedRankRestartsTheWholeGroupWithTheRestartCount) {
  const Outcome o = run_hp(sh_ranks(2,
                                    "echo $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS $MASTER_PORT $$; "
                                    "[ $TORCHELASTIC_RESTART_COUNT -eq 2 ] && exit 0; "
                                    "if [ $RANK = 1 ]; then sleep 0.3; exit 3; fi; exec sleep 60",
                                    {"--max-restarts", "2"}));
  EXPECT_LT(o.seconds, 10.0);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  const auto ranks = by_rank(o.out);
  ASSERT_EQ(ranks.size(), 2u) << o.out;
  std::vector<std::string> ports;
  for (const auto& [rank, lines] : ranks) {
    ASSERT_EQ(lines.size(), 3u) << "rank " << rank << ":\n" << o.out;
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::istringstream fields(lines[static_cast<size_t>(attempt)]);
      std::string count, max, port, pid;
      fields >> count >> max >> port >> pid;
      EXPECT_EQ(count, std::to_string(attempt));
      EXPECT_EQ(max, "2");
      if (rank == 0) ports.push_back(port);
      EXPECT_EQ(port, ports.at(static_cast<size_t>(attempt))) << "the ranks of one attempt share MASTER_PORT";
      // Nothing of a failed attempt outlives it.
      EXPECT_TRUE(wait_until_gone(std::stoi(pid), 1.0)) << "rank " << rank << " of attempt " << attempt;
    }
  }
  EXPECT_TRUE(contains(o.err,
                       "hp-run: restarting all 2 ranks (restart 1 of --max-restarts 2) after: rank 1 exited "
                       "with status 3"))
      << o.err;
  EXPECT_TRUE(contains(o.err, "(restart 2 of --max-restarts 2)")) << o.err;
  EXPECT_FALSE(contains(o.err, "FAILED")) << o.err;
}

TEST(Launcher, WhenRestartsRunOutTheLastFailureIsTheVerdict) {
  const Outcome o = run_hp(sh_ranks(
      2, "echo attempt $TORCHELASTIC_RESTART_COUNT; [ $RANK = 0 ] && exit 5; exec sleep 60", {"--max-restarts", "1"}));
  EXPECT_LT(o.seconds, 10.0);
  EXPECT_EQ(o.exit_code, 5) << o.err;
  // Rank 0 fails at once in both attempts (rank 1 may be stopped before it prints).
  EXPECT_EQ(by_rank(o.out)[0], (std::vector<std::string>{"attempt 0", "attempt 1"})) << o.out;
  EXPECT_TRUE(contains(o.err, "(restart 1 of --max-restarts 1)")) << o.err;
  EXPECT_TRUE(contains(o.err, "hp-run: FAILED: rank 0 exited with status 5 (no restart left: --max-restarts 1)"))
      << o.err;
}

// A shell function `record MESSAGE` that writes the rank's error file as
// record_fatal_error() does (rank_error_file.h: header, time in ns, message; via rename).
constexpr const char* kRecordError =
    "record() { printf 'hp-rank-error v1\\n%s\\n%s' \"$(date +%s%N)\" \"$1\" > \"$HP_ERROR_FILE.tmp\" && "
    "mv \"$HP_ERROR_FILE.tmp\" \"$HP_ERROR_FILE\"; }";

// Rank 2 fails first (its error file says so) but is slow to leave; rank 0 sees the
// failure, records its own error and exits at once. hp-run reaps rank 0 first, yet names
// rank 2, with rank 2's status and message (torchrun's error files).
TEST(Launcher, TheRankWhoseErrorCameFirstIsNamedNotTheFirstToExit) {
  const Outcome o = run_hp(
      sh_ranks(3, std::string(kRecordError) +
                      "; dir=$(dirname \"$HP_ERROR_FILE\"); "
                      "if [ \"$RANK\" = 2 ]; then record 'the real cause'; trap 'exit 3' TERM; sleep 60 & wait; fi; "
                      "if [ \"$RANK\" = 0 ]; then while [ ! -e \"$dir/rank-2\" ]; do sleep 0.01; done; "
                      "record 'lost my peer'; exit 1; fi; exec sleep 60"));
  EXPECT_LT(o.seconds, 10.0);
  EXPECT_EQ(o.exit_code, 3) << o.err;
  EXPECT_TRUE(contains(o.err, "hp-run: rank 0 (local rank 0, pid ")) << o.err;
  EXPECT_TRUE(contains(o.err, "hp-run: rank 2's error was recorded first; rank 0 exited with status 1 before it"))
      << o.err;
  EXPECT_TRUE(contains(o.err, "hp-run: FAILED: rank 2 exited with status 3: the real cause")) << o.err;
}

// Ranks that agree on a failure all stop at once: rank 0's "failed on rank(s) 1" (marked as
// caused by a peer) is recorded before rank 1's own error. The FAILED line quotes rank 1's
// own error, not the echo (probe: it quoted "... failed on rank(s) 1 (their error says why)").
TEST(Launcher, ARanksOwnErrorIsNamedBeforeAnEarlierPeerEcho) {
  const Outcome o =
      run_hp(sh_ranks(2, std::string(kRecordError) + "; dir=$(dirname \"$HP_ERROR_FILE\"); "
                                                     "if [ \"$RANK\" = 0 ]; then record 'cause: peer\n"
                                                     "saving failed on rank(s) 1 (their error says why)'; "
                                                     "while [ ! -e \"$dir/rank-1\" ]; do sleep 0.01; done; exit 1; fi; "
                                                     "sleep 0.2; record 'rank-1.pt: Is a directory'; exit 1"));
  EXPECT_LT(o.seconds, 10.0);
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_TRUE(contains(o.err, "hp-run: FAILED: rank 1 exited with status 1: rank-1.pt: Is a directory")) << o.err;
  EXPECT_FALSE(contains(o.err, "FAILED: rank 0")) << o.err;
}

// A crash leaves no error file: rank 0 dies of SIGKILL, and rank 1 records "lost my
// peer" only when hp-run stops it. The crash came first, so rank 0 is named (as torchrun
// dates a failure without an error file by when it saw the rank exit).
TEST(Launcher, ACrashWithoutAnErrorFileIsNamedBeforeLaterErrors) {
  const Outcome o =
      run_hp(sh_ranks(2, std::string(kRecordError) + "; "
                                                     "if [ \"$RANK\" = 0 ]; then sleep 0.2; kill -KILL $$; fi; "
                                                     "trap 'record \"lost my peer\"; exit 1' TERM; sleep 60 & wait"));
  EXPECT_LT(o.seconds, 10.0);
  EXPECT_EQ(o.exit_code, 128 + SIGKILL) << o.err;
  EXPECT_TRUE(contains(o.err, "hp-run: FAILED: rank 0 killed by signal 9 (SIGKILL)")) << o.err;
  EXPECT_FALSE(contains(o.err, "rank 1's error was recorded first")) << o.err;
}

// The error folder is hp-run's own and is gone after the job.
TEST(Launcher, ErrorFilesAreCleanedUp) {
  char dir[] = "/tmp/hp_run_tmpdir_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const Outcome o = [&] {
    ScopedEnv tmpdir("TMPDIR", dir);
    return run_hp(sh_ranks(2, "echo \"$HP_ERROR_FILE\"; echo oops > \"$HP_ERROR_FILE\"; exit 4"));
  }();
  EXPECT_EQ(o.exit_code, 4) << o.err;
  EXPECT_TRUE(contains(o.out, std::string(dir) + "/hp-run-errors-")) << o.out;
  EXPECT_TRUE(contains(o.err, "hp-run: FAILED: rank ")) << o.err;
  EXPECT_EQ(::rmdir(dir), 0) << "hp-run left files in " << dir;
}

TEST(Launcher, RankKilledBySignalGivesExitCode128PlusSignal) {
  const Outcome o = run_hp(sh_ranks(3, "if [ \"$RANK\" = 1 ]; then kill -KILL $$; fi; exec sleep 60"));
  EXPECT_LT(o.seconds, 10.0);
  EXPECT_EQ(o.exit_code, 128 + SIGKILL) << o.err;
  EXPECT_TRUE(contains(o.err, "hp-run: FAILED: rank 1 killed by signal 9 (SIGKILL)")) << o.err;
}

TEST(Launcher, RankIgnoringSigtermIsKilledAfterTimeoutOnFailure) {
  // Rank 0 fails only once rank 1 ignores SIGTERM (signalled via a file), so
  // the grace period is really waited out.
  char dir[] = "/tmp/hp_run_test_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string ready = std::string(dir) + "/ready";
  const Outcome o = run_hp(sh_ranks(2,
                                    "if [ \"$RANK\" = 0 ]; then while [ ! -e " + ready +
                                        " ]; do sleep 0.01; done; exit 5; fi; "
                                        "trap '' TERM; : > " +
                                        ready + "; sleep 60",
                                    {"--timeout-on-failure", "1"}));
  ::unlink(ready.c_str());
  ::rmdir(dir);
  EXPECT_EQ(o.exit_code, 5) << o.err;
  EXPECT_GE(o.seconds, 0.9);
  EXPECT_LT(o.seconds, 6.0);
  EXPECT_TRUE(contains(o.err,
                       "rank(s) 1 still running 1 s after being asked to stop; "
                       "sending SIGKILL"))
      << o.err;
}

TEST(Launcher, AllRanksSucceedingExitsZeroEvenIfTheyFinishAtDifferentTimes) {
  ScopedEnv set("OMP_NUM_THREADS", "1");  // else hp-run's one line on threads per rank is on stderr
  const Outcome o = run_hp(sh_ranks(3, "sleep 0.$RANK; echo done"));
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(by_rank(o.out).size(), 3u);
  EXPECT_EQ(o.err, "");
}

// Starts 2 ranks that report their pid and sleep, sends `sig` to hp-run and
// checks that it stops promptly, with 128+sig, leaving no rank behind.
static void expect_signal_is_forwarded(int sig, std::vector<std::string> extra = {}) {
  HpRun run(sh_ranks(2, "echo started $$; exec sleep 60", std::move(extra)));
  ASSERT_TRUE(run.wait_for_stdout([](const std::string& out) { return lines_of(out).size() >= 2; }, 5.0)) << run.out();
  std::vector<pid_t> ranks;
  for (const auto& entry : by_rank(run.out())) {
    ranks.push_back(std::stoi(entry.second.at(0).substr(std::string("started ").size())));
  }
  ASSERT_EQ(ranks.size(), 2u);
  const auto sent = Clock::now();
  run.send(sig);
  const Outcome o = run.finish(10.0);
  EXPECT_LT(seconds_since(sent), 3.0);
  EXPECT_EQ(o.exit_code, 128 + sig) << o.err;
  EXPECT_TRUE(contains(o.err, "received " + hl::signal_name(sig))) << o.err;
  for (pid_t pid : ranks) EXPECT_TRUE(wait_until_gone(pid, 1.0)) << "rank pid " << pid;
  EXPECT_FALSE(contains(o.err, "restarting")) << o.err;
}

TEST(Launcher, SigtermToLauncherIsForwardedToAllRanks) { expect_signal_is_forwarded(SIGTERM); }

TEST(Launcher, SigintToLauncherIsForwardedToAllRanks) { expect_signal_is_forwarded(SIGINT); }

// Stopping hp-run is not a failure to recover from: torchrun does not restart either.
TEST(Launcher, AStoppedLauncherDoesNotRestartItsRanks) { expect_signal_is_forwarded(SIGTERM, {"--max-restarts", "2"}); }

TEST(Launcher, RanksDieWhenLauncherIsKilled) {
#ifndef __linux__
  GTEST_SKIP() << "relies on PR_SET_PDEATHSIG";
#endif
  // A SIGKILLed hp-run cannot remove its folder of error files: it makes it in this test's.
  char dir[] = "/tmp/hp_run_tmpdir_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  ScopedEnv tmpdir("TMPDIR", dir);
  HpRun run(sh_ranks(2, "echo started $$; exec sleep 60"));
  ASSERT_TRUE(run.wait_for_stdout([](const std::string& out) { return lines_of(out).size() >= 2; }, 5.0));
  std::vector<pid_t> ranks;
  for (const auto& entry : by_rank(run.out())) {
    ranks.push_back(std::stoi(entry.second.at(0).substr(std::string("started ").size())));
  }
  run.send(SIGKILL);
  const Outcome o = run.finish(10.0);
  EXPECT_EQ(o.term_signal, SIGKILL);
  for (pid_t pid : ranks) EXPECT_TRUE(wait_until_gone(pid, 3.0)) << "rank pid " << pid;
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST(Launcher, LongOutputIsPrefixedLineByLineAndComplete) {
  // Each line is written in two pieces, and the last has no newline at all.
  ScopedEnv set("OMP_NUM_THREADS", "1");  // stderr holds the ranks' lines alone
  const Outcome o = run_hp(sh_ranks(2,
                                    "i=0; while [ $i -lt 2000 ]; do printf 'r%s-' $RANK; printf '%s\\n' $i; "
                                    "printf 'e%s-%s\\n' $RANK $i >&2; i=$((i+1)); done; printf 'tail-r%s' $RANK"));
  EXPECT_EQ(o.exit_code, 0) << o.err;
  for (const auto& [stream, text] :
       {std::pair<std::string, std::string>{"stdout", o.out}, std::pair<std::string, std::string>{"stderr", o.err}}) {
    const auto ranks = by_rank(text);
    ASSERT_EQ(ranks.size(), 2u) << stream;
    for (const auto& [rank, lines] : ranks) {
      const bool is_out = stream == "stdout";
      ASSERT_EQ(lines.size(), is_out ? 2001u : 2000u) << stream << " of rank " << rank;
      for (int i = 0; i < 2000; ++i) {
        const std::string expected = (is_out ? "r" : "e") + std::to_string(rank) + "-" + std::to_string(i);
        ASSERT_EQ(lines[static_cast<size_t>(i)], expected) << stream << " of rank " << rank;
      }
      if (is_out) {
        EXPECT_EQ(lines.back(), "tail-r" + std::to_string(rank));
      }
    }
  }
}

TEST(Launcher, UnexecutableProgramIsReportedAndExits127) {
  const Outcome o = run_hp({"--nproc-per-node", "2", "/nonexistent/program", "arg"});
  EXPECT_EQ(o.exit_code, 127) << o.err;
  EXPECT_TRUE(contains(o.err, "cannot execute '/nonexistent/program': No such file or directory")) << o.err;
  EXPECT_TRUE(contains(o.err, "hp-run: FAILED: rank ")) << o.err;
}

TEST(Launcher, CommandLineErrorsExitWithStatus2NamingTheProblem) {
  Outcome o = run_hp({"--nproc-per-node", "2"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "missing PROGRAM")) << o.err;

  o = run_hp({"--frobnicate", "sh"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "unknown option '--frobnicate'")) << o.err;

  o = run_hp({"--nproc-per-node", "two", "sh"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "--nproc-per-node expects an integer, got 'two'")) << o.err;

  o = run_hp({"--nnodes", "2", "sh"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "--master-port is required")) << o.err;
  EXPECT_EQ(o.out, "");
}

TEST(Launcher, HelpPrintsUsageAndExitsZero) {
  const Outcome o = run_hp({"--help"});
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_TRUE(contains(o.out, "usage: hp-run")) << o.out;
  EXPECT_TRUE(contains(o.out, "--timeout-on-failure")) << o.out;
}
