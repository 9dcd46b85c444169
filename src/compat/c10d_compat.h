// The one place that knows which LibTorch it is built against.
//
// LibTorch 2.x splits a process group into a ProcessGroup front and one Backend per
// device type; which backends exist (NCCL) depends on how LibTorch was built.
// Everything else in the project talks to `ProcessGroupPtr` through
// src/core/communicator.cpp and never includes a backend header itself.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace hyper_parallel::compat {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

// Whether this LibTorch was built with NCCL.
bool has_nccl();

// "gloo" for cpu, "nccl" for cuda when this LibTorch has NCCL; throws otherwise.
std::string default_backend_for(const std::string& device_type);

// Creates a process group of `size` members in which the caller is `rank`.
// All members must call it with a store that gives them the same namespace. "fake"
// (fake_backend.h): collectives complete at once and move nothing; no other member exists.
// "fake": c10d's FakeProcessGroup, which completes every collective at once without moving
// data; the caller is then the only member that exists (a dry run of a large world).
ProcessGroupPtr make_process_group(const std::string& backend, const StorePtr& store, int rank, int size,
                                   std::chrono::milliseconds timeout);

// Whether `pg` implements reduce_scatter natively for tensors on `device` (NCCL; Gloo from
// LibTorch 2.x for CPU tensors).
bool has_native_reduce_scatter(const ProcessGroupPtr& pg, c10::DeviceType device);

// Whether `pg`'s list all-gather for tensors on `device` may be handed output tensors that
// are strided views (e.g. column blocks of one matrix). Gloo gathers into a staging buffer
// of its own and copy_()s each piece into its output, so a view of the final tensor saves
// a concatenation; NCCL is not relied on for this.
bool all_gather_takes_strided_outputs(const ProcessGroupPtr& pg, c10::DeviceType device);

// TCPStore for multi-process rendezvous: the server (`serve`: rank 0, unless a launcher
// already serves one there) or a client of it.
StorePtr make_tcp_store(const std::string& host, uint16_t port, bool serve, int world_size,
                        std::chrono::milliseconds timeout);

}  // namespace hyper_parallel::compat
