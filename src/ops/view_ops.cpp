#include "ops/view_ops.h"

#include "dispatch/op_param_choice.h"

#include <ATen/TensorUtils.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>

namespace hyper_parallel {

namespace {

int64_t norm_dim(int64_t d, int64_t ndim) { return d < 0 ? d + ndim : d; }

std::vector<Layout> layouts_for(const OpCall& call, const Placements& ps,
                                const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<Layout> out;
  for (const auto& s : shapes) out.emplace_back(call.mesh(), ps, s);
  return out;
}

ShardingDecision single_input(const OpCall& call, const Placements& want, const Placements& out) {
  ShardingDecision d;
  d.input_placements.assign(call.tensors().size(), std::nullopt);
  d.input_placements[0] = want;
  for (const auto& shapes : infer_output_shapes(call)) d.output_layouts.push_back(layouts_for(call, out, shapes));
  return d;
}

const TensorArg& dtensor_self(const OpCall& call) {
  const TensorArg& self = call.tensors().at(0);
  TORCH_CHECK(self.layout, call.name(), ": expected the first tensor argument to be a DTensor");
  return self;
}

// Dim groups of a reshape: consecutive input dims whose product equals that of
// consecutive output dims.
struct DimGroup {
  int64_t in_begin, in_end, out_begin, out_end;
};

std::vector<DimGroup> dim_groups(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<DimGroup> groups;
  const int64_t ni = in.size(), no = out.size();
  int64_t i = 0, j = 0;
  while (i < ni || j < no) {
    DimGroup g{i, i, j, j};
    int64_t pi = 1, pj = 1;
    if (i < ni) pi *= in[i++];
    if (j < no) pj *= out[j++];
    while (pi != pj) {
      if ((pi < pj && i < ni) || j >= no) {
        TORCH_CHECK(i < ni, "reshape: shapes ", c10::IntArrayRef(in), " and ", c10::IntArrayRef(out),
                    " have different numbers of elements");
        pi *= in[i++];
      } else {
        pj *= out[j++];
      }
    }
    g.in_end = i;
    g.out_end = j;
    groups.push_back(g);
  }
  return groups;
}

// Where Shard(d) of `in` lands in `out` under a reshape on a mesh dim of size n, or -1.
int64_t reshaped_shard_dim(const std::vector<int64_t>& in, const std::vector<int64_t>& out, int64_t d, int64_t n) {
  for (const auto& g : dim_groups(in, out)) {
    if (d < g.in_begin || d >= g.in_end) continue;
    int64_t first_in = g.in_begin;
    while (first_in < g.in_end && in[first_in] == 1) ++first_in;
    int64_t first_out = g.out_begin;
    while (first_out < g.out_end && out[first_out] == 1) ++first_out;
    if (first_in != d || first_out == g.out_end) return -1;
    int64_t inner_in = 1, inner_out = 1;
    for (int64_t k = d + 1; k < g.in_end; ++k) inner_in *= in[k];
    for (int64_t k = first_out + 1; k < g.out_end; ++k) inner_out *= out[k];
    // The pieces must be the same flat ranges of the group on both sides.
    for (int64_t k = 0; k < n; ++k) {
      ChunkRange a = chunk_range(in[d], n, k), b = chunk_range(out[first_out], n, k);
      if (a.offset * inner_in != b.offset * inner_out || a.length * inner_in != b.length * inner_out) {
        return -1;
      }
    }
    return first_out;
  }
  return -1;
}

c10::List<int64_t> int_list(const std::vector<int64_t>& v) { return c10::List<int64_t>(v); }

}  // namespace

std::string ReshapeOp::rule() const {
  return "a shard on the leading dim of a reshape group stays when its pieces are chunks of "
         "the output dim; otherwise gathered. Partial passes";
}

ShardingDecision ReshapeOp::infer_layout(const OpCall& call) const {
  const TensorArg& self = dtensor_self(call);
  const auto shapes = infer_output_shapes(call);
  const std::vector<int64_t>& out_shape = shapes.at(0).at(0);
  const Placements& in = self.layout->placements();
  Placements want = in, out = in;
  const bool nested = self.layout->has_nested_shards();
  const bool is_expand = expanding_;
  for (size_t m = 0; m < in.size(); ++m) {
    if (!in[m].is_shard()) continue;
    int64_t od = -1;
    if (!nested) {
      if (is_expand) {
        const int64_t shift = static_cast<int64_t>(out_shape.size() - self.shape.size());
        const int64_t d = in[m].dim();
        if (self.shape[d] == out_shape[d + shift]) od = d + shift;
      } else {
        od = reshaped_shard_dim(self.shape.vec(), out_shape, in[m].dim(), call.mesh().size(m));
      }
    }
    if (od < 0) {
      want[m] = out[m] = Placement::replicate();
    } else {
      out[m] = Placement::shard(od);
    }
  }
  ShardingDecision d;
  d.input_placements.assign(call.tensors().size(), std::nullopt);
  d.input_placements[0] = want;
  d.output_layouts.push_back({Layout(call.mesh(), out, out_shape)});
  return d;
}

void ReshapeOp::expand(const OpCall& call, const ShardingDecision& d, torch::jit::Stack& local) const {
  // The size argument names the global shape: each rank views to its own piece.
  auto idx = call.schema().argumentIndexWithName("size");
  if (!idx) return;
  const std::vector<int64_t>& local_shape = d.output_layouts[0][0].local_shape();
  local[*idx] = int_list(local_shape);
  if (expanding_) return;
  const at::Tensor& self = local[0].toTensor();
  auto stride = at::detail::computeStride(self.sizes(), self.strides(), local_shape);
  if (!stride) {
    // The global tensor is viewable but this rank's piece (e.g. a column slice) is not:
    // reshape a contiguous copy, as torch.reshape would.
    local[0] = self.contiguous();
    stride = contiguous_strides(local_shape);
  }
  if (auto sidx = call.schema().argumentIndexWithName("stride")) local[*sidx] = int_list(*stride);
}

ShardingDecision PermuteOp::infer_layout(const OpCall& call) const {
  const TensorArg& self = dtensor_self(call);
  const int64_t ndim = self.shape.size();
  std::vector<int64_t> perm(ndim);
  std::iota(perm.begin(), perm.end(), 0);
  if (kind_ == Kind::Permute) {
    perm = call.arg("dims").toIntVector();
    for (auto& p : perm) p = norm_dim(p, ndim);
  } else if (kind_ == Kind::Transpose) {
    std::swap(perm[norm_dim(call.arg("dim0").toInt(), ndim)], perm[norm_dim(call.arg("dim1").toInt(), ndim)]);
  } else if (ndim == 2) {  // t
    std::swap(perm[0], perm[1]);
  }
  Placements out = self.layout->placements();
  for (auto& p : out) {
    if (p.is_shard()) p = Placement::shard(std::find(perm.begin(), perm.end(), p.dim()) - perm.begin());
  }
  return single_input(call, self.layout->placements(), out);
}

ShardingDecision IndexingViewOp::infer_layout(const OpCall& call) const {
  const TensorArg& self = dtensor_self(call);
  const bool backward = kind_ == Kind::SelectBackward || kind_ == Kind::SliceBackward;
  const bool removes_dim = kind_ == Kind::Select;
  const bool adds_dim = kind_ == Kind::SelectBackward;
  // The dim indexed, in the coordinates of self.
  int64_t ndim_ref = adds_dim ? self.shape.size() + 1 : self.shape.size();
  int64_t dim = norm_dim(call.arg("dim").toInt(), ndim_ref);
  Placements want = self.layout->placements(), out = want;
  for (size_t m = 0; m < want.size(); ++m) {
    if (!want[m].is_shard()) continue;
    int64_t d = want[m].dim();
    if (adds_dim) {
      out[m] = Placement::shard(d >= dim ? d + 1 : d);
    } else if (d == dim) {
      // Indexing a sharded dim: only a full slice can keep it.
      bool whole = false;
      if (kind_ == Kind::Slice || kind_ == Kind::SliceBackward) {
        const int64_t size = backward ? call.arg("input_sizes").toIntVector()[dim] : self.shape[dim];
        const auto start = call.arg("start"), end = call.arg("end");
        int64_t s = start.isNone() ? 0 : start.toInt(), e = end.isNone() ? size : end.toInt();
        whole = s == 0 && e >= size && call.arg("step").toInt() == 1;
      }
      if (!whole) want[m] = out[m] = Placement::replicate();
    } else if (removes_dim && d > dim) {
      out[m] = Placement::shard(d - 1);
    }
  }
  return single_input(call, want, out);
}

void IndexingViewOp::expand(const OpCall& call, const ShardingDecision& d, torch::jit::Stack& local) const {
  if (auto idx = call.schema().argumentIndexWithName("input_sizes")) {
    local[*idx] = int_list(d.output_layouts[0][0].local_shape());
  }
}

ShardingDecision SplitOp::infer_layout(const OpCall& call) const {
  const TensorArg& self = dtensor_self(call);
  const int64_t ndim = self.shape.size();
  const int64_t dim = norm_dim(call.has_arg("dim") ? call.arg("dim").toInt() : 0, ndim);
  Placements want = self.layout->placements(), out = want;
  for (size_t m = 0; m < want.size(); ++m) {
    if (!want[m].is_shard()) continue;
    if (want[m].dim() == dim) {
      want[m] = out[m] = Placement::replicate();
    } else if (removes_dim_ && want[m].dim() > dim) {
      out[m] = Placement::shard(want[m].dim() - 1);
    }
  }
  return single_input(call, want, out);
}

ShardingDecision ConcatOp::infer_layout(const OpCall& call) const {
  TORCH_CHECK(!call.dtensor_indices().empty(), call.name(), ": no DTensor input");
  const Layout& first = call.first_layout();
  const int64_t in_ndim = first.ndim();
  const bool stacking = stacking_;
  const int64_t out_ndim = stacking ? in_ndim + 1 : in_ndim;
  const int64_t dim = norm_dim(call.has_arg("dim") ? call.arg("dim").toInt() : 0, out_ndim);
  Placements want = first.placements();
  bool all_partial = true;
  for (size_t m = 0; m < want.size(); ++m) {
    if (want[m].is_shard() && !stacking && want[m].dim() == dim) want[m] = Placement::replicate();
    if (want[m].is_partial()) {
      for (const auto& t : call.tensors()) {
        all_partial &= t.layout && t.layout->placement(m) == want[m];
      }
      if (!all_partial) want[m] = Placement::replicate();
    }
  }
  Placements out = want;
  if (stacking) {
    for (auto& p : out)
      if (p.is_shard() && p.dim() >= dim) p = Placement::shard(p.dim() + 1);
  }
  ShardingDecision d;
  for (const auto& t : call.tensors()) {
    // Empty legacy 1-D inputs to cat are skipped by ATen; leave them alone.
    const bool skip = !stacking && t.shape.size() == 1 && t.shape[0] == 0 && in_ndim != 1;
    d.input_placements.push_back(skip ? std::nullopt : std::optional<Placements>(want));
  }
  for (const auto& shapes : infer_output_shapes(call)) d.output_layouts.push_back(layouts_for(call, out, shapes));
  return d;
}

HP_REGISTER_OP_CLASS(ReshapeOp, [](const OpParams& p) {
  return std::make_shared<ReshapeOp>(param_choice(p, "ReshapeOp", "kind", {"reshape", "expand"}) == 1);
});
HP_REGISTER_OP_CLASS(PermuteOp, [](const OpParams& p) {
  return std::make_shared<PermuteOp>(
      static_cast<PermuteOp::Kind>(param_choice(p, "PermuteOp", "kind", {"permute", "transpose", "t"})));
});
HP_REGISTER_OP_CLASS(IndexingViewOp, [](const OpParams& p) {
  return std::make_shared<IndexingViewOp>(static_cast<IndexingViewOp::Kind>(
      param_choice(p, "IndexingViewOp", "kind", {"select", "slice", "select_backward", "slice_backward"})));
});
HP_REGISTER_OP_CLASS(SplitOp, [](const OpParams& p) {
  return std::make_shared<SplitOp>(param_choice(p, "SplitOp", "kind", {"split", "unbind"}) == 1);
});
HP_REGISTER_OP_CLASS(ConcatOp, [](const OpParams& p) {
  return std::make_shared<ConcatOp>(param_choice(p, "ConcatOp", "kind", {"cat", "stack"}) == 1);
});

}  // namespace hyper_parallel
