#include "compat/c10d_compat.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <c10/util/Exception.h>

namespace hyper_parallel::compat {

namespace {
#if TORCH_VERSION_MAJOR >= 2
// LibTorch 2.x: a ProcessGroup is a front that forwards to one Backend per device type.
template <typename BackendT>
ProcessGroupPtr wrap_backend(const StorePtr& store, int rank, int size,
                             c10::intrusive_ptr<BackendT> backend, c10::DeviceType device,
                             c10d::ProcessGroup::BackendType type) {
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  pg->setDefaultBackend(type);
  pg->setBackend(device, type, backend);
  return pg;
}
#endif
}  // namespace

std::string default_backend_for(const std::string& device_type) {
  if (device_type == "cpu") return "gloo";
  if (device_type == "cuda") {
#if defined(USE_C10D_NCCL)
    return "nccl";
#else
    TORCH_CHECK(false, "device type 'cuda' needs a LibTorch built with NCCL; this one (",
                TORCH_VERSION, ") has none. Expected device type 'cpu'.");
#endif
  }
  TORCH_CHECK(false, "unsupported device type '", device_type, "': expected 'cpu' or 'cuda'");
}

ProcessGroupPtr make_process_group(const std::string& backend, const StorePtr& store, int rank,
                                   int size, std::chrono::milliseconds timeout) {
  if (backend == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
#if TORCH_VERSION_MAJOR >= 2
    return wrap_backend(store, rank, size, gloo, c10::DeviceType::CPU,
                        c10d::ProcessGroup::BackendType::GLOO);
#else
    return gloo;
#endif
  }
#if defined(USE_C10D_NCCL)
  if (backend == "nccl") {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
#if TORCH_VERSION_MAJOR >= 2
    return wrap_backend(store, rank, size, nccl, c10::DeviceType::CUDA,
                        c10d::ProcessGroup::BackendType::NCCL);
#else
    return nccl;
#endif
  }
#endif
  TORCH_CHECK(false, "unknown or unavailable process-group backend '", backend,
              "': expected 'gloo'", 
#if defined(USE_C10D_NCCL)
              " or 'nccl'"
#else
              " (this LibTorch has no NCCL)"
#endif
  );
}

bool has_native_reduce_scatter(const ProcessGroupPtr& pg) {
#if TORCH_VERSION_MAJOR >= 2
  (void)pg;
  return true;
#else
  return pg->getBackendName() != "gloo";
#endif
}

StorePtr make_tcp_store(const std::string& host, uint16_t port, int rank, int world_size,
                        std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = rank == 0;
  opts.numWorkers = world_size;
  opts.waitWorkers = true;
  opts.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

}  // namespace hyper_parallel::compat
