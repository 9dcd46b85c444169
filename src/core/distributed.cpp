#include "hyper_parallel/core/distributed.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>
#include <mutex>

#include "compat/c10d_compat.h"
#include "hyper_parallel/core/communicator.h"

namespace hyper_parallel {

namespace {
std::mutex global_mutex;
std::shared_ptr<World> global_world;
thread_local std::shared_ptr<World> thread_world;

constexpr const char* kLaunchHint =
    "; launch with `hp-run --nproc-per-node N PROGRAM` or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT";

// An integer environment variable in [lo, hi]; an error naming it, its value and the
// range otherwise (strtoll alone would read "x" as 0 and "70000" as a port).
int64_t env_int(const char* name, int64_t lo, int64_t hi, const std::string& meaning) {
  const char* v = std::getenv(name);
  TORCH_CHECK(v && *v, "init_process_group: environment variable ", name, " is not set", kLaunchHint);
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  TORCH_CHECK(end != v && *end == '\0' && errno == 0 && x >= lo && x <= hi, "init_process_group: ", name, "='", v,
              "' is not valid: expected an integer in [", lo, ", ", hi, "] (", meaning, ")");
  return x;
}

// An optional integer variable; `fallback` when unset.
int64_t env_int_or(const char* name, int64_t fallback, int64_t lo, int64_t hi, const std::string& meaning) {
  const char* v = std::getenv(name);
  return v ? env_int(name, lo, hi, meaning) : fallback;
}

constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;

// HP_BACKEND when set, else options.backend; one of auto, gloo, nccl.
std::string validated_backend(const InitOptions& options) {
  const char* env = std::getenv("HP_BACKEND");
  const std::string backend = env && *env ? env : options.backend;
  TORCH_CHECK(backend == "auto" || backend == "gloo" || backend == "nccl" || backend == "fake",
              env && *env ? "HP_BACKEND='" : "InitOptions::backend='", backend,
              "' is not valid: expected auto, gloo, nccl or fake");
  return backend;
}

// Ranks as threads have no LOCAL_RANK of their own: their rank is their local rank.
int64_t local_rank_of(int64_t rank, const InitOptions& options) {
  if (options.per_thread) return rank;
  return env_int_or("LOCAL_RANK", rank, 0, 1 << 20, "this process's index on its machine");
}

// torchrun's elastic agent serves the store at MASTER_ADDR:MASTER_PORT itself when it says
// TORCHELASTIC_USE_AGENT_STORE=True, and its static rendezvous keeps that store across
// restarts (torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py). Every rank is
// then its client, and each attempt (TORCHELASTIC_RESTART_COUNT) writes under a prefix of
// its own: a restarted group that read its predecessor's keys would connect to the Gloo
// addresses of dead ranks and hang. PyTorch's env:// rendezvous used this prefix too.
bool launcher_serves_store() {
  const char* v = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  return v && std::string(v) == "True";
}

c10::intrusive_ptr<c10d::Store> rendezvous_store(const std::string& addr, int64_t port, int64_t rank, int64_t size,
                                                 int64_t attempt, std::chrono::milliseconds timeout) {
  const bool agent = launcher_serves_store();
  auto store =
      compat::make_tcp_store(addr, static_cast<uint16_t>(port), rank == 0 && !agent, static_cast<int>(size), timeout);
  if (!agent) return store;  // rank 0's own store ends with its group: nothing stale in it
  return c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(attempt), store);
}

void install(std::shared_ptr<World> w, bool per_thread) {
  if (per_thread) {
    thread_world = std::move(w);
    return;
  }
  std::lock_guard<std::mutex> lock(global_mutex);
  TORCH_CHECK(!global_world,
              "init_process_group: the default process group is already "
              "initialised (rank ",
              global_world->rank, " of ", global_world->size, ")");
  global_world = std::move(w);
}
}  // namespace

std::chrono::milliseconds default_collective_timeout() {
  const char* v = std::getenv("HP_COLLECTIVE_TIMEOUT_S");
  if (!v) return std::chrono::seconds(300);
  // atof would turn "abc" or "0" into a 0 ms timeout that fails every collective.
  errno = 0;
  char* end = nullptr;
  const double seconds = *v ? std::strtod(v, &end) : 0.0;
  TORCH_CHECK(*v && end != v && *end == '\0' && errno == 0 && std::isfinite(seconds) && seconds > 0 &&
                  seconds <= kMaxTimeoutSeconds,
              "HP_COLLECTIVE_TIMEOUT_S='", v, "' is not valid: expected a number of seconds in (0, ",
              static_cast<int64_t>(kMaxTimeoutSeconds), "] (the bound on every collective; default 300)");
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000)));
}

c10::Device select_rank_device(const std::string& device_type, int64_t local_rank) {
  if (device_type == "cpu") return c10::Device(c10::kCPU);
  TORCH_CHECK(device_type == "cuda", "unsupported device type '", device_type, "': expected 'cpu' or 'cuda'");
  TORCH_CHECK(at::globalContext().hasCUDA(),
              "device type 'cuda': no GPU is visible to this "
              "process (or this LibTorch has no CUDA); expected at least one CUDA device");
  const int gpus = at::detail::getCUDAHooks().getNumGPUs();
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % gpus));
  c10::impl::VirtualGuardImpl(c10::kCUDA).setDevice(device);
  return device;
}

void init_process_group(const InitOptions& options) {
  const int64_t size = env_int("WORLD_SIZE", 1, 1 << 20, "the number of ranks");
  const int64_t rank = env_int("RANK", 0, size - 1, "this process's rank, below WORLD_SIZE");
  const int64_t port = env_int("MASTER_PORT", 1, 65535, "the TCP port of rank 0's store");
  const char* addr = std::getenv("MASTER_ADDR");
  // With other ranks, 127.0.0.1 is a guess that is wrong on every other machine: such a rank
  // would wait out the store's timeout and fail without naming the variable.
  TORCH_CHECK(size == 1 || (addr && *addr),
              "init_process_group: environment variable MASTER_ADDR is not set: expected the host of rank 0's store "
              "when WORLD_SIZE (",
              size, ") > 1", kLaunchHint);
  // Everything else the environment says, before a port is bound.
  default_collective_timeout();
  validated_backend(options);
  local_rank_of(rank, options);
  const int64_t attempt = env_int_or("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 20, "the group's restarts so far");
  auto store = rendezvous_store(addr && *addr ? addr : "127.0.0.1", port, rank, size, attempt, options.timeout);
  init_process_group(store, rank, size, options);
}

void init_process_group(c10::intrusive_ptr<c10d::Store> store, int64_t rank, int64_t world_size,
                        const InitOptions& options) {
  TORCH_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
              "init_process_group: expected 0 <= rank < world_size, got rank ", rank, " and world_size ", world_size);
  auto w = std::make_shared<World>();
  w->store = std::move(store);
  w->rank = rank;
  w->size = world_size;
  w->device_type = options.device_type;
  const std::string backend = validated_backend(options);
  w->backend = backend == "auto" ? compat::default_backend_for(options.device_type) : backend;
  w->device = select_rank_device(options.device_type, local_rank_of(rank, options));
  if (w->backend == "nccl") {
    const int64_t ranks_here = options.per_thread ? world_size
                                                  : env_int_or("LOCAL_WORLD_SIZE", world_size, 1, world_size,
                                                               "ranks on this machine, at most WORLD_SIZE");
    const int gpus = at::detail::getCUDAHooks().getNumGPUs();
    TORCH_CHECK(ranks_here <= gpus, "init_process_group: backend 'nccl' with ", ranks_here,
                " ranks on this machine but ", gpus,
                " GPU(s): NCCL refuses two ranks on one GPU. "
                "Expected at most one rank per GPU, or backend 'gloo' (HP_BACKEND=gloo) to share GPUs");
  }
  w->timeout = options.timeout;
  if (std::getenv("HP_COLLECTIVE_TIMEOUT_S")) w->timeout = default_collective_timeout();
  install(std::move(w), options.per_thread);
}

bool is_initialized() {
  if (thread_world) return true;
  std::lock_guard<std::mutex> lock(global_mutex);
  return global_world != nullptr;
}

void destroy_process_group() {
  if (thread_world) {
    thread_world.reset();
    return;
  }
  std::lock_guard<std::mutex> lock(global_mutex);
  global_world.reset();
}

World& current_world() {
  if (thread_world) return *thread_world;
  std::lock_guard<std::mutex> lock(global_mutex);
  TORCH_CHECK(global_world,
              "the default process group is not initialised: call "
              "hyper_parallel::init_process_group() (or init_device_mesh, which does it from "
              "the environment hp-run sets)");
  return *global_world;
}

int64_t get_rank() { return current_world().rank; }
int64_t get_world_size() { return current_world().size; }

}  // namespace hyper_parallel
