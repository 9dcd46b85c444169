#include "compat/c10d_compat.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <c10/util/Exception.h>

#include <initializer_list>

#include "compat/fake_backend.h"
#include "compat/meta_kernels.h"

namespace hyper_parallel::compat {

namespace {
// A ProcessGroup is a front that forwards to one Backend per device type. Gloo serves CPU
// tensors and, for several ranks sharing one GPU (NCCL refuses that), CUDA tensors too;
// NCCL serves CUDA tensors only.
template <typename BackendT>
ProcessGroupPtr wrap_backend(const StorePtr& store, int rank, int size, c10::intrusive_ptr<BackendT> backend,
                             std::initializer_list<c10::DeviceType> devices, c10d::ProcessGroup::BackendType type) {
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  pg->setDefaultBackend(type);
  for (c10::DeviceType device : devices) pg->setBackend(device, type, backend);
  return pg;
}
}  // namespace

bool has_nccl() {
#if defined(USE_C10D_NCCL)
  return true;
#else
  return false;
#endif
}

std::string default_backend_for(const std::string& device_type) {
  if (device_type == "cpu") return "gloo";
  if (device_type == "cuda") {
    TORCH_CHECK(has_nccl(), "device type 'cuda' needs a LibTorch built with NCCL; this one (", TORCH_VERSION,
                ") has none. Expected device type 'cpu', or backend 'gloo'.");
    return "nccl";
  }
  TORCH_CHECK(false, "unsupported device type '", device_type, "': expected 'cpu' or 'cuda'");
}

ProcessGroupPtr make_process_group(const std::string& backend, const StorePtr& store, int rank, int size,
                                   std::chrono::milliseconds timeout) {
  if (backend == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
    return wrap_backend(store, rank, size, gloo, {c10::DeviceType::CPU, c10::DeviceType::CUDA},
                        c10d::ProcessGroup::BackendType::GLOO);
  }
  if (backend == "fake") {
    // Collectives that complete at once and move nothing: one process plays rank `rank`,
    // on meta tensors (what the step runs on them needs kernels LibTorch may lack).
    register_missing_meta_kernels();
    return wrap_backend(store, rank, size, make_fake_backend(rank, size),
                        {c10::DeviceType::CPU, c10::DeviceType::CUDA, c10::DeviceType::Meta},
                        c10d::ProcessGroup::BackendType::CUSTOM);
  }
#if defined(USE_C10D_NCCL)
  if (backend == "nccl") {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
    return wrap_backend(store, rank, size, nccl, {c10::DeviceType::CUDA}, c10d::ProcessGroup::BackendType::NCCL);
  }
#endif
  TORCH_CHECK(false, "unknown or unavailable process-group backend '", backend, "': expected 'gloo', ",
              has_nccl() ? "'nccl' " : "", "or 'fake'", has_nccl() ? "" : " (this LibTorch has no NCCL)");
}

bool has_native_reduce_scatter(const ProcessGroupPtr& pg, c10::DeviceType device) {
  // Gloo's reduce_scatter takes CPU tensors only.
  return pg->getBackendName() != "gloo" || device == c10::DeviceType::CPU;
}

bool all_gather_takes_strided_outputs(const ProcessGroupPtr& pg, c10::DeviceType device) {
  return pg->getBackendName() == "gloo" && device == c10::DeviceType::CPU;
}

StorePtr make_tcp_store(const std::string& host, uint16_t port, bool serve, int world_size,
                        std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = serve;
  opts.numWorkers = world_size;
  opts.waitWorkers = true;
  opts.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

}  // namespace hyper_parallel::compat
