// The default process group ("the world"): who this rank is, how to rendezvous.
//
// As in torch.distributed, it is initialised once per process, from the environment
// hp-run sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Tests that run ranks as
// threads of one process give each thread its own world with `per_thread = true`.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace c10d {
class Store;
class ProcessGroup;
}  // namespace c10d

namespace hyper_parallel {

class Communicator;

struct InitOptions {
  // "auto" picks gloo for cpu and nccl for cuda. "gloo" with device type "cuda" lets
  // several ranks share one GPU (NCCL refuses two ranks on one device). "fake": collectives
  // that complete at once and move nothing (hp-dry-run plays one rank of a large world).
  // HP_BACKEND overrides this field when set.
  std::string backend = "auto";
  // "cpu" or "cuda". With "cuda" each rank uses cuda:(LOCAL_RANK mod #GPUs) and makes it
  // the current device.
  std::string device_type = "cpu";
  // Bound on every collective and on rendezvous: a rank that dies makes the
  // others fail after at most this long instead of waiting forever.
  // HP_COLLECTIVE_TIMEOUT_S overrides the default when set.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  // The world belongs to the calling thread only (ranks-as-threads tests).
  bool per_thread = false;
};

struct World {
  c10::intrusive_ptr<c10d::Store> store;
  int64_t rank = 0;
  int64_t size = 1;
  std::string backend;
  std::string device_type;
  c10::Device device = c10::Device(c10::kCPU);  // where this rank's tensors live
  std::chrono::milliseconds timeout;
  // Meshes created so far; every rank creates meshes in the same order, so the
  // counter gives each mesh's groups a rendezvous namespace of their own.
  int64_t meshes_created = 0;
  // The groups of every mesh created in this world: owned here, so that they live until
  // destroy_process_group() however many handles and cached layouts refer to a mesh.
  std::vector<std::shared_ptr<Communicator>> groups;
};

// Initialises from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (TCPStore hosted by rank 0).
void init_process_group(const InitOptions& options = {});
// Initialises over a store the caller provides (HashStore shared by threads, FileStore ...).
void init_process_group(c10::intrusive_ptr<c10d::Store> store, int64_t rank, int64_t world_size,
                        const InitOptions& options = {});
bool is_initialized();
void destroy_process_group();
int64_t get_rank();
int64_t get_world_size();
// Throws with a hint when nothing is initialised.
World& current_world();

std::chrono::milliseconds default_collective_timeout();

// The device a rank with this local rank uses for `device_type` ("cpu", or "cuda": GPU
// local_rank mod the number of GPUs, which becomes the current device). Throws, saying so,
// when there is no GPU or LibTorch has no CUDA.
c10::Device select_rank_device(const std::string& device_type, int64_t local_rank);

}  // namespace hyper_parallel

HP_PUBLIC_END
