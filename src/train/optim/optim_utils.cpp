#include "train/optim/optim_utils.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <map>

#include "hyper_parallel/dtensor/dtensor.h"

namespace hyper_parallel::train {

namespace {

// Elements per fp64 chunk: 64 KiB of scratch, which stays in cache between the
// conversion and the dot product that reads it back.
constexpr int64_t kNormChunk = int64_t{1} << 13;

}  // namespace

double squared_norm_fp64(const at::Tensor& t) {
  at::NoGradGuard no_grad;
  // A meta tensor (hp-dry-run) has a shape and no values: it adds nothing, and clipping
  // still issues its collectives.
  if (t.numel() == 0 || t.is_meta()) return 0.0;
  const at::Tensor flat = t.is_contiguous() ? t.reshape({-1}) : t.contiguous().reshape({-1});
  if (flat.scalar_type() == at::kDouble) return at::dot(flat, flat).item<double>();
  // fp64 accumulation without a full fp64 copy: each chunk is widened into one reused
  // scratch buffer and summed there; the chunks' sums accumulate on the tensor's device.
  const int64_t n = flat.numel();
  at::Tensor scratch = at::empty({std::min(n, kNormChunk)}, flat.options().dtype(at::kDouble));
  at::Tensor total = at::zeros({}, flat.options().dtype(at::kDouble));
  for (int64_t begin = 0; begin < n; begin += kNormChunk) {
    const int64_t len = std::min(kNormChunk, n - begin);
    at::Tensor s = scratch.narrow(0, 0, len);
    s.copy_(flat.narrow(0, begin, len));
    total.add_(at::dot(s, s));
  }
  return total.item<double>();
}

double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm) {
  // Squared sums bucketed by the mesh and the mesh dims that shard them: each bucket is
  // all-reduced once over exactly those dims. Buckets are reduced in the order the
  // parameters first reach them, which is the same on every rank (the same model): an
  // order by anything rank-specific (a hash of process-group addresses) could make ranks
  // issue collectives on different groups in different orders and deadlock.
  double replicated = 0;
  struct Bucket {
    DeviceMesh mesh;
    std::vector<int64_t> dims;
    double sum = 0;
  };
  std::vector<Bucket> buckets;
  std::map<std::pair<size_t, std::vector<int64_t>>, size_t> bucket_of;  // identity -> index
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters) {
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    if (!is_dtensor(g)) {
      replicated += squared_norm_fp64(g);
      continue;
    }
    Placements ps = placements_of(g);
    bool has_partial = false;
    for (const auto& pl : ps) has_partial |= pl.is_partial();
    if (has_partial) {
      for (auto& pl : ps)
        if (pl.is_partial()) pl = Placement::replicate();
      g = redistribute(g, ps);
    }
    std::vector<int64_t> dims;
    for (size_t m = 0; m < ps.size(); ++m)
      if (ps[m].is_shard()) dims.push_back(static_cast<int64_t>(m));
    const double local = squared_norm_fp64(to_local(g));
    if (dims.empty()) {
      replicated += local;
      continue;
    }
    auto [it, fresh] = bucket_of.try_emplace({mesh_of(g).identity_hash(), dims}, buckets.size());
    if (fresh) buckets.push_back(Bucket{mesh_of(g), dims, 0.0});
    buckets[it->second].sum += local;
  }
  double total = replicated;
  for (auto& b : buckets) {
    at::Tensor s = at::scalar_tensor(b.sum, at::kDouble).to(b.mesh.device());  // NCCL needs CUDA
    for (int64_t m : b.dims) b.mesh.comm(m).all_reduce_(s, ReduceOp::Sum);
    total += s.item<double>();
  }
  const double norm = std::sqrt(total);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    at::NoGradGuard no_grad;
    for (auto& g : grads) g.mul_(coef);
  }
  return norm;
}

}  // namespace hyper_parallel::train
