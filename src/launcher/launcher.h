// launcher.h — the library behind `hp-run`, the torchrun-like launcher of
// HyperParallel C++.
//
// `hp-run --nproc-per-node N [...] PROGRAM ARGS...` starts N copies of PROGRAM
// on this node, each with the torch.distributed environment variables (RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT), prefixes every line they print with `[rankK]: `, forwards
// SIGINT/SIGTERM to them, and stops all of them as soon as one fails. With
// --max-restarts N it then starts all of them again, up to N times, as torchrun's
// elastic agent does (TORCHELASTIC_RESTART_COUNT counts the restarts).
//
// Pure C++17 + POSIX; deliberately independent of LibTorch so that the
// launcher builds and runs even where the tensor library does not.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace hyper_parallel::launcher {

// Everything `hp-run` was asked to do, as parsed from its command line.
struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  // 0 means "not given": a free local port is chosen at launch. Only allowed
  // with a single node, since the other nodes could not know the choice.
  int master_port = 0;
  // Seconds between SIGTERM and SIGKILL when the ranks are being stopped
  // (after a failure or after hp-run itself was interrupted).
  double timeout_on_failure = 5.0;
  // --threads-per-rank: each rank's intra-op threads (OMP_NUM_THREADS); 0 means "auto" (the
  // cores hp-run may use, split between the local ranks). Unset: torchrun's rule
  // (rank_threads).
  std::optional<int> threads_per_rank;
  // --max-restarts: how often the whole group is started again after a rank failed
  // (torchrun's default, 0: never). One node only: hp-run's static rendezvous has no
  // round the nodes agree on, so a restart on one node could meet the other nodes'
  // previous group (torchrun --rdzv-backend c10d restarts across nodes).
  int max_restarts = 0;
  // --help was given; nothing else is validated then.
  bool show_help = false;
  // PROGRAM followed by its arguments, passed through verbatim.
  std::vector<std::string> command;
};

// A command-line mistake; the message says what was expected and what was
// found. hp-run reports it and exits with status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses hp-run's arguments (without the program name). Options end at the
// first argument that is not an option (PROGRAM) or at `--`; everything after
// that belongs to PROGRAM. Throws UsageError.
LaunchOptions parse_arguments(const std::vector<std::string>& args);

// Same, from main()'s argc/argv (argv[0] is skipped).
LaunchOptions parse_arguments(int argc, const char* const* argv);

// The text printed by --help.
std::string usage_text();

// Binds a TCP socket to port 0 on 127.0.0.1, reads back the port the kernel
// chose, and closes the socket. Throws std::system_error.
int pick_free_port();

// The variables that identify local rank `local_rank` to the program, in the
// order they are set; `restart_count` is the group's restarts so far
// (TORCHELASTIC_RESTART_COUNT, beside TORCHELASTIC_MAX_RESTARTS, as torchrun sets them).
std::vector<std::pair<std::string, std::string>> rank_environment(const LaunchOptions& options, int local_rank,
                                                                  int master_port, int restart_count = 0);

// The intra-op threads each rank is given, and what hp-run says about it (once).
struct RankThreads {
  std::optional<int> omp_num_threads;  // unset: the rank inherits hp-run's environment
  std::string message;                 // "" when there is nothing to say
};

// --threads-per-rank N or auto when given (auto: max(1, usable_cores / nproc_per_node)),
// overriding OMP_NUM_THREADS; otherwise torchrun's rule: OMP_NUM_THREADS=1 for each rank when
// several share the node and the variable is unset (LibTorch would give every rank one
// thread per core), and nothing when it is set or there is one rank. `omp_num_threads` is
// hp-run's own OMP_NUM_THREADS (nullptr: unset).
RankThreads rank_threads(const LaunchOptions& options, const char* omp_num_threads, int usable_cores);

// The cores this process may run on (its CPU affinity), at least 1.
int usable_cores();

// "SIGKILL" for 9, "signal 77" for numbers it does not know.
std::string signal_name(int signal_number);

// A waitpid() status in words: "exited with status 3",
// "killed by signal 9 (SIGKILL)".
std::string describe_wait_status(int wait_status);

// The exit code hp-run returns for a failed rank's waitpid() status: the
// rank's exit status if it is in 1..127, 128+signal if it was killed by a
// signal, 1 otherwise.
int exit_code_for_wait_status(int wait_status);

// Starts the ranks, relays their output, supervises them until all have
// exited (starting all of them again after a failure while --max-restarts
// allows), and returns hp-run's exit code: 0 if every rank exited 0, the
// failed rank's code (see exit_code_for_wait_status) when no restart is left,
// or 128+signal if hp-run was stopped by SIGINT/SIGTERM. Installs signal handlers for its duration,
// so it must not run concurrently with itself. Throws std::system_error only
// for failures before any rank was started.
int launch(const LaunchOptions& options);

}  // namespace hyper_parallel::launcher
