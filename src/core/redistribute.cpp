#include "core/redistribute.h"

#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

namespace hyper_parallel {

namespace {

// Size of tensor dim `d` that mesh dim `m` chunks, given the shards of mesh dims < m
// in `placements` at this rank's coordinate.
int64_t size_before_mesh_dim(const Layout& layout, const Placements& placements, int64_t d, int64_t m) {
  int64_t s = layout.shape()[d];
  const auto& coord = layout.mesh().coordinate();
  for (int64_t j = 0; j < m; ++j) {
    if (placements[j].is_shard(d)) s = chunk_range(s, layout.mesh().size(j), coord[j]).length;
  }
  return s;
}

at::Tensor unshard(const at::Tensor& local, const Layout& layout, const Placements& cur, int64_t m) {
  const int64_t d = cur[m].dim();
  const int64_t full = size_before_mesh_dim(layout, cur, d, m);
  const int64_t n = layout.mesh().size(m);
  std::vector<int64_t> sizes(n);
  for (int64_t k = 0; k < n; ++k) sizes[k] = chunk_range(full, n, k).length;
  return layout.mesh().comm(m).all_gather(local, d, sizes);
}

at::Tensor take_chunk(const at::Tensor& local, const Layout& layout, int64_t d, int64_t m) {
  const ChunkRange r = chunk_range(local.size(d), layout.mesh().size(m), layout.mesh().coordinate()[m]);
  return local.narrow(d, r.offset, r.length);
}

// Replicate -> Partial(op): a value whose reduction over the group is `local`.
// Sum keeps the value on coordinate 0 and zeros elsewhere (exact, unlike local / n).
at::Tensor partition(const at::Tensor& local, const Layout& layout, ReduceOp op, int64_t m) {
  if (op == ReduceOp::Sum && layout.mesh().coordinate()[m] != 0) return at::zeros_like(local);
  return local;
}

}  // namespace

Placements partial_to_replicate(const Placements& placements) {
  Placements out = placements;
  for (auto& p : out)
    if (p.is_partial()) p = Placement::replicate();
  return out;
}

at::Tensor redistribute_local(const at::Tensor& local, const Layout& from, const Layout& to) {
  TORCH_CHECK(from.mesh() == to.mesh(), "redistribute across meshes is not supported: from ", from.mesh().str(), " to ",
              to.mesh().str());
  TORCH_CHECK(from.shape() == to.shape(), "redistribute cannot change the global shape (",
              c10::IntArrayRef(from.shape()), " vs ", c10::IntArrayRef(to.shape()), ")");
  if (from.placements() == to.placements()) return local;
  const int64_t nm = from.mesh().ndim();
  Placements cur = from.placements();
  const Placements& tgt = to.placements();
  at::Tensor t = local;

  // A mesh dim's shard can stay only if every earlier mesh dim that shards the same
  // tensor dim (now or in the target) stays too: otherwise its nesting changes.
  std::vector<bool> kept(nm, false);
  for (int64_t i = 0; i < nm; ++i) {
    if (!(cur[i] == tgt[i] && cur[i].is_shard())) continue;
    bool ok = true;
    for (int64_t j = 0; j < i; ++j) {
      bool same_dim = cur[j].is_shard(cur[i].dim()) || tgt[j].is_shard(cur[i].dim());
      if (same_dim && !(kept[j])) ok = false;
    }
    kept[i] = ok;
  }

  // Phase 1: un-shard, innermost mesh dim first.
  for (int64_t i = nm - 1; i >= 0; --i) {
    if (cur[i].is_shard() && !kept[i]) {
      t = unshard(t, from, cur, i);
      cur[i] = Placement::replicate();
    }
  }
  // Phase 2: reduce partials.
  for (int64_t i = 0; i < nm; ++i) {
    if (!cur[i].is_partial() || cur[i] == tgt[i]) continue;
    const ReduceOp op = cur[i].reduce_op();
    bool direct_scatter = tgt[i].is_shard();
    if (direct_scatter) {
      // Scattering now is exact only if no earlier mesh dim still has to shard this dim.
      for (int64_t j = 0; j < i; ++j) {
        if (tgt[j].is_shard(tgt[i].dim()) && cur[j] != tgt[j]) direct_scatter = false;
      }
      for (int64_t j = i + 1; j < nm; ++j) {
        if (cur[j].is_shard(tgt[i].dim())) direct_scatter = false;
      }
    }
    if (direct_scatter) {
      t = from.mesh().comm(i).reduce_scatter(t, tgt[i].dim(), op);
      cur[i] = tgt[i];
    } else {
      t = t.clone();  // never reduce into the caller's tensor
      from.mesh().comm(i).all_reduce_(t, op);
      cur[i] = Placement::replicate();
    }
  }
  // Phase 3: apply target shards and partials, outermost mesh dim first.
  for (int64_t i = 0; i < nm; ++i) {
    if (cur[i] == tgt[i]) continue;
    TORCH_INTERNAL_ASSERT(cur[i].is_replicate(), "redistribute: unexpected ", cur[i].str());
    if (tgt[i].is_shard()) {
      t = take_chunk(t, from, tgt[i].dim(), i);
    } else if (tgt[i].is_partial()) {
      t = partition(t, from, tgt[i].reduce_op(), i);
    }
    cur[i] = tgt[i];
  }
  // The result is a new tensor, as in PyTorch: no view into the source piece.
  return t.is_alias_of(local) ? t.clone(at::MemoryFormat::Contiguous) : t;
}

}  // namespace hyper_parallel
