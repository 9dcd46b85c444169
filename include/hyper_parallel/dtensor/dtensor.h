// DTensor: a distributed tensor that *is* an at::Tensor.
//
// A DTensor's TensorImpl (DTensorImpl) holds this rank's local piece and its Layout.
// It reports the global sizes and the local dtype/device, so ordinary LibTorch code
// (torch::nn::Linear, cross_entropy, loss.backward()) runs on it; every ATen op on a
// DTensor is routed to OpDispatcher::dispatch. The functions below mirror PyTorch's
// torch.distributed.tensor API and are differentiable with its backward semantics.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/layout.h"
#include "hyper_parallel/core/placement.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

struct FromLocalOptions {
  // Verify across the mesh that the pieces fit together (shapes, dtypes): one all-gather
  // of metadata; and, as PyTorch, broadcast the data of coordinate 0 along every
  // Replicate mesh dim (one broadcast each). Off by default, as in PyTorch.
  bool run_check = false;
  // Global shape/stride. Without them the shards are taken to be even (local * n).
  std::optional<std::vector<int64_t>> shape;
  std::optional<std::vector<int64_t>> stride;
  // The placements `local`'s gradient is redistributed to before it is unwrapped.
  // Unset: the forward placements with Partial -> Replicate (PyTorch's default).
  std::optional<Placements> grad_placements;
};

// The DTensor whose full value is `full` as held at coordinate `src_data_rank` of every
// mesh dim (PyTorch's default 0: the source's data, so the result is the single-device
// tensor even where ranks hold different data). Mesh dim by mesh dim, in order: Shard
// scatters the source's pieces (one scatter), Replicate and Partial broadcast (one
// broadcast). std::nullopt (PyTorch's src_data_rank=None) takes each rank's own `full`
// as is, with no collective: only right when every rank holds the same data. Every rank
// passes the same shape and dtype. `full` must be a leaf (use DTensor::from_local
// inside autograd); the result is a leaf with full's requires_grad.
at::Tensor distribute_tensor(const at::Tensor& full, const DeviceMesh& mesh, const Placements& placements,
                             std::optional<int64_t> src_data_rank = 0);

struct DTensor {
  // Wraps each rank's `local` piece. Differentiable: the gradient of `local` is the
  // gradient's local piece once redistributed to `placements` (Partial -> Replicate).
  static at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                               const FromLocalOptions& options = {});
};

// The local piece (differentiable: its gradient comes back as a DTensor of the same
// layout, or of `grad_placements` when given).
at::Tensor to_local(const at::Tensor& dtensor, const std::optional<Placements>& grad_placements = std::nullopt);
// All-gathers / reduces into the full tensor on every rank (differentiable; the plain
// gradient is taken as `grad_placements`' pieces when given, else as Replicate).
at::Tensor full_tensor(const at::Tensor& dtensor, const std::optional<Placements>& grad_placements = std::nullopt);
// Moves to other placements (differentiable; backward goes the other way, with
// Partial sources receiving Replicate gradients as in PyTorch).
at::Tensor redistribute(const at::Tensor& dtensor, const DeviceMesh& mesh, const Placements& placements);
at::Tensor redistribute(const at::Tensor& dtensor, const Placements& placements);

bool is_dtensor(const at::Tensor& t);
const Layout& layout_of(const at::Tensor& dtensor);
const Placements& placements_of(const at::Tensor& dtensor);
const DeviceMesh& mesh_of(const at::Tensor& dtensor);

}  // namespace hyper_parallel

HP_PUBLIC_END
