// The public DTensor functions and the autograd nodes that give them PyTorch's
// backward semantics (FromLocal / ToLocal / Redistribute).
#include <algorithm>

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "compat/autograd_compat.h"
#include "core/redistribute.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"

namespace hyper_parallel {

namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

bool needs_history(const at::Tensor& input) { return torch::autograd::GradMode::is_enabled() && input.requires_grad(); }

void attach(at::Tensor& output, const at::Tensor& input, compat::NodePtr node) {
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::create_gradient_edge(output, std::move(node));
}

const Layout& require_layout(const at::Tensor& grad, const char* where) {
  auto* impl = dtensor_impl(grad);
  TORCH_CHECK(impl, where,
              ": expected the incoming gradient to be a DTensor, got a plain tensor "
              "of shape ",
              grad.sizes());
  return impl->layout();
}

// Gradient of a DTensor-valued output, redistributed to `target` and unwrapped.
at::Tensor local_grad(const at::Tensor& grad, const Layout& target, const char* where) {
  const Layout& have = require_layout(grad, where);
  return redistribute_local(local_of(grad), have, target);
}

struct FromLocalBackward : Node {
  explicit FromLocalBackward(Layout grad_layout) : grad_layout(std::move(grad_layout)) {}
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    return {local_grad(grads[0], grad_layout, "DTensor::from_local backward")};
  }
  std::string name() const override { return "hyper_parallel::FromLocalBackward"; }
  Layout grad_layout;  // the from_local layout with Partial -> Replicate
};

struct ToLocalBackward : Node {
  explicit ToLocalBackward(Layout grad_layout) : grad_layout(std::move(grad_layout)) {}
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    TORCH_CHECK(!dtensor_impl(grads[0]),
                "to_local backward: expected a plain local gradient, "
                "got a DTensor");
    return {make_dtensor(grads[0], grad_layout)};
  }
  std::string name() const override { return "hyper_parallel::ToLocalBackward"; }
  Layout grad_layout;
};

struct RedistributeBackward : Node {
  explicit RedistributeBackward(Layout grad_layout) : grad_layout(std::move(grad_layout)) {}
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    return {make_dtensor(local_grad(grads[0], grad_layout, "redistribute backward"), grad_layout)};
  }
  std::string name() const override { return "hyper_parallel::RedistributeBackward"; }
  Layout grad_layout;
};

std::vector<int64_t> even_global_shape(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements) {
  std::vector<int64_t> shape(local.sizes().begin(), local.sizes().end());
  for (size_t m = 0; m < placements.size(); ++m) {
    const Placement p = placements[m].normalized(local.dim());
    if (p.is_shard()) shape[p.dim()] *= mesh.size(static_cast<int64_t>(m));
  }
  return shape;
}

// Every rank reports (dtype, local shape); each must be what the layout assigns it.
void check_pieces_across_mesh(const at::Tensor& local, const Layout& layout) {
  const DeviceMesh& mesh = layout.mesh();
  const int64_t nd = local.dim();
  std::vector<int64_t> mine{static_cast<int64_t>(local.scalar_type()), nd};
  mine.insert(mine.end(), local.sizes().begin(), local.sizes().end());
  at::Tensor buf = at::tensor(mine, at::kLong).to(mesh.device());  // NCCL needs CUDA tensors
  // Gather along every mesh dim in turn: afterwards each rank has everyone's report.
  at::Tensor all = buf.unsqueeze(0);
  for (int64_t m = mesh.ndim() - 1; m >= 0; --m) {
    std::vector<int64_t> sizes(mesh.size(m), all.size(0));
    all = mesh.comm(m).all_gather(all, 0, sizes);
  }
  auto acc = all.accessor<int64_t, 2>();
  for (int64_t r = 0; r < all.size(0); ++r) {
    std::vector<int64_t> coord(mesh.ndim());
    int64_t rem = r;
    for (int64_t m = mesh.ndim() - 1; m >= 0; --m) {
      coord[m] = rem % mesh.size(m);
      rem /= mesh.size(m);
    }
    std::vector<int64_t> expect_shape, offset;
    layout.local_piece_at(coord, &expect_shape, &offset);
    TORCH_CHECK(acc[r][0] == mine[0], "DTensor::from_local(run_check): rank ", mesh.ranks()[r], " has dtype ",
                c10::toString(static_cast<c10::ScalarType>(acc[r][0])), " but this rank has ", local.scalar_type());
    TORCH_CHECK(acc[r][1] == nd, "DTensor::from_local(run_check): rank ", mesh.ranks()[r], " has a ", acc[r][1],
                "-D piece but this rank has a ", nd, "-D one");
    for (int64_t d = 0; d < nd; ++d) {
      TORCH_CHECK(acc[r][2 + d] == expect_shape[d], "DTensor::from_local(run_check): rank ", mesh.ranks()[r], " holds ",
                  acc[r][2 + d], " rows along dim ", d, " but ", layout.str(), " assigns it ", expect_shape[d]);
    }
  }
}

// This rank's piece of the value `data` has at coordinate `src` of every mesh dim, mesh dim
// by mesh dim as PyTorch's distribute_tensor: Shard scatters, Replicate and Partial
// broadcast; Partial then keeps the value on one coordinate (local_piece's rule).
at::Tensor piece_from_source(const at::Tensor& data, const Layout& target, int64_t src) {
  const DeviceMesh& mesh = target.mesh();
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    TORCH_CHECK(src >= 0 && src < mesh.size(m), "distribute_tensor: src_data_rank ", src,
                " is not a coordinate of every dim of ", mesh.str(),
                " (it names the source's rank "
                "within each mesh dim, as PyTorch's; std::nullopt takes each rank's own data)");
  }
  at::Tensor piece = data;
  bool owned = false;  // piece is a buffer of our own, not the caller's storage
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    const Placement p = target.placements()[m].normalized(data.dim());
    if (p.is_shard()) {
      piece = mesh.comm(m).scatter(piece, p.dim(), src);
      owned = !piece.is_alias_of(data);
    } else {
      if (!owned) piece = piece.clone(at::MemoryFormat::Contiguous);
      owned = true;
      mesh.comm(m).broadcast_(piece, src);
    }
  }
  const Layout replicated_partials = target.with_placements(partial_to_replicate(target.placements()));
  return redistribute_local(piece, replicated_partials, target);
}

}  // namespace

bool is_dtensor(const at::Tensor& t) { return dtensor_impl(t) != nullptr; }

const Layout& layout_of(const at::Tensor& dtensor) {
  auto* impl = dtensor_impl(dtensor);
  TORCH_CHECK(impl, "expected a DTensor, got a plain tensor of shape ", dtensor.sizes());
  return impl->layout();
}
const Placements& placements_of(const at::Tensor& t) { return layout_of(t).placements(); }
const DeviceMesh& mesh_of(const at::Tensor& t) { return layout_of(t).mesh(); }

at::Tensor distribute_tensor(const at::Tensor& full, const DeviceMesh& mesh, const Placements& placements,
                             std::optional<int64_t> src_data_rank) {
  TORCH_CHECK(!is_dtensor(full), "distribute_tensor expects a plain tensor, got a DTensor with ",
              to_string(placements_of(full)));
  TORCH_CHECK(full.is_leaf(),
              "distribute_tensor expects a leaf tensor (a parameter, a buffer, data), got one "
              "computed by ",
              full.grad_fn()->name(), "; use DTensor::from_local to make a DTensor inside autograd");
  // As PyTorch: the tensor moves to the mesh's device type first; a meta tensor (a model
  // built under ParametersOnMeta) stays on meta, its pieces shapes only.
  at::Tensor data =
      full.device().type() == mesh.device().type() || full.is_meta() ? full.detach() : full.detach().to(mesh.device());
  const std::vector<int64_t> shape(data.sizes().begin(), data.sizes().end());
  Layout target(mesh, placements, shape);
  // A meta tensor has no data to send: its pieces are cut locally whatever the source.
  at::Tensor local =
      src_data_rank && !data.is_meta() ? piece_from_source(data, target, *src_data_rank) : local_piece(data, target);
  at::Tensor out = make_dtensor(local.is_alias_of(full) ? local.clone() : local, target);
  if (full.requires_grad()) out.set_requires_grad(true);
  return out;
}

at::Tensor DTensor::from_local(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                               const FromLocalOptions& options) {
  TORCH_CHECK(!is_dtensor(local), "DTensor::from_local expects a plain local tensor, got a DTensor");
  std::vector<int64_t> shape = options.shape ? *options.shape : even_global_shape(local, mesh, placements);
  Layout layout(mesh, placements, shape, options.stride.value_or(std::vector<int64_t>{}));
  at::Tensor data = local;
  if (options.run_check) {
    check_pieces_across_mesh(local, layout);
    // As PyTorch: Replicate mesh dims take coordinate 0's data (into a copy: the caller's
    // tensor is not written).
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      if (!placements[m].is_replicate()) continue;
      if (data.is_same(local)) data = local.detach().clone(at::MemoryFormat::Contiguous);
      mesh.comm(m).broadcast_(data, 0);
    }
  }
  at::Tensor out = make_dtensor(data, layout);
  if (needs_history(local)) {
    const Placements grad = options.grad_placements.value_or(partial_to_replicate(layout.placements()));
    attach(out, local, compat::make_node<FromLocalBackward>(layout.with_placements(grad)));
  }
  return out;
}

at::Tensor to_local(const at::Tensor& dtensor, const std::optional<Placements>& grad_placements) {
  const Layout& layout = layout_of(dtensor);
  // A new TensorImpl over the same data, so the history we attach is its own.
  at::Tensor out = local_of(dtensor).detach();
  if (needs_history(dtensor)) {
    Layout grad_layout = grad_placements ? layout.with_placements(*grad_placements) : layout;
    attach(out, dtensor, compat::make_node<ToLocalBackward>(grad_layout));
  }
  return out;
}

at::Tensor redistribute(const at::Tensor& dtensor, const DeviceMesh& mesh, const Placements& placements) {
  const Layout& from = layout_of(dtensor);
  TORCH_CHECK(mesh == from.mesh(),
              "redistribute to another mesh is not supported: the tensor "
              "lives on ",
              from.mesh().str(), ", asked for ", mesh.str());
  Layout to = from.with_placements(placements);
  at::Tensor out = make_dtensor(redistribute_local(local_of(dtensor), from, to), to);
  if (needs_history(dtensor)) {
    attach(out, dtensor,
           compat::make_node<RedistributeBackward>(from.with_placements(partial_to_replicate(from.placements()))));
  }
  return out;
}

at::Tensor redistribute(const at::Tensor& dtensor, const Placements& placements) {
  return redistribute(dtensor, mesh_of(dtensor), placements);
}

at::Tensor full_tensor(const at::Tensor& dtensor, const std::optional<Placements>& grad_placements) {
  const Layout& layout = layout_of(dtensor);
  return to_local(redistribute(dtensor, Placements(layout.mesh().ndim(), Placement::replicate())), grad_placements);
}

}  // namespace hyper_parallel
