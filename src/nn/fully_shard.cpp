#include "hyper_parallel/nn/fully_shard.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <deque>
#include <set>
#include <stdexcept>

#include "hyper_parallel/core/pending_collective.h"
#include "hyper_parallel/dtensor/dtensor.h"

namespace hyper_parallel {

namespace {

// FSDP2's storage resize: a parameter's storage is released and later allocated and filled
// again in place, so the tensors autograd saved in forward (which share it) read the
// gathered values again in backward.
void release_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void allocate_storage(const at::Tensor& t) {
  const size_t bytes = static_cast<size_t>(t.storage_offset() + t.numel()) * t.element_size();
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() >= bytes && s->data_ptr().get() != nullptr) return;
  c10::Allocator* allocator = s->allocator() ? s->allocator() : c10::GetAllocator(t.device().type());
  s->set_data_ptr_noswap(allocator->allocate(bytes));
  s->set_nbytes(bytes);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

struct FullyShardedParameters::Impl {
  struct Param {
    std::string name;
    at::Tensor param;        // the module's: a leaf whose storage comes and goes
    at::Tensor local;        // its local piece (the same storage), contiguous
    at::Tensor shard;        // the optimizer's leaf (a DTensor)
    at::Tensor shard_local;  // its local piece
    int64_t rows = 0;        // local.size(0)
    int64_t row = 0;         // elements per row
    ChunkRange mine{0, 0};   // this rank's rows
    int64_t offset = 0;      // in its group's per-rank segment, in elements
    size_t group = 0;
    bool got_gradient = false;
  };
  struct Group {
    std::vector<size_t> params;
    int64_t segment = 0;  // elements each rank sends: every parameter's chunk, padded
    at::ScalarType compute_dtype = at::kFloat;
    bool gathered = false;
    PendingCollective gather;
    at::Tensor gather_send, gather_recv;
    at::Tensor gradients;  // [n x segment] in the reduce dtype, filled as gradients arrive
    size_t gradients_in = 0;
  };
  struct GradientTaken final : torch::autograd::PostAccumulateGradHook {
    GradientTaken(Impl* impl, size_t index) : impl(impl), index(index) {}
    void operator()(const torch::autograd::Variable& param) override { impl->on_gradient(index, param); }
    Impl* impl;
    size_t index;
  };
  struct Reduction {
    size_t group;
    PendingCollective pending;
    at::Tensor send, recv;
  };

  DeviceMesh mesh;
  const Communicator* shard_comm = nullptr;
  const Communicator* replicate_comm = nullptr;  // HSDP; null without
  int64_t n = 1, rank = 0;
  FullyShardOptions options;
  std::vector<Param> params;
  std::vector<Group> groups;
  std::vector<at::Tensor> shards;
  std::vector<std::string> names;
  std::deque<Reduction> reductions;
  FullyShardStats stats;

  // A collective waited for: what it took and what of it this rank spent blocked.
  void account(PendingCollective& p) {
    const auto start = std::chrono::steady_clock::now();
    p.wait();
    stats.blocked_seconds += seconds_since(start);
    stats.collective_seconds += p.completed_seconds();
  }

  void start_gather(size_t g) {
    Group& group = groups[g];
    if (group.gathered || group.gather_recv.defined()) return;
    at::NoGradGuard no_grad;
    const at::TensorOptions o = params[group.params.front()].local.options().dtype(group.compute_dtype);
    group.gather_send = at::empty({group.segment}, o);
    for (size_t i : group.params) {
      const Param& p = params[i];
      if (p.mine.length > 0)
        group.gather_send.narrow(0, p.offset, p.mine.length * p.row).copy_(p.shard_local.reshape({-1}));
    }
    group.gather_recv = at::empty({n * group.segment}, o);
    group.gather = PendingCollective::start_all_gather(*shard_comm, group.gather_send, group.gather_recv);
    ++stats.all_gathers;
    if (n > 1) stats.bytes_sent += group.segment * static_cast<int64_t>(c10::elementSize(group.compute_dtype));
  }

  void ensure_gathered(size_t g) {
    Group& group = groups[g];
    if (group.gathered) return;
    start_gather(g);
    account(group.gather);
    at::NoGradGuard no_grad;
    // Below ADInplaceOrView: filling the storage must not bump the parameters' version
    // counters, or autograd would take the tensors it saved as modified in place.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (size_t i : group.params) {
      Param& p = params[i];
      allocate_storage(p.local);
      const at::Tensor flat = p.local.view({-1});
      for (int64_t r = 0; r < n; ++r) {
        const ChunkRange c = chunk_range(p.rows, n, r);
        if (c.length == 0) continue;
        flat.narrow(0, c.offset * p.row, c.length * p.row)
            .copy_(group.gather_recv.narrow(0, r * group.segment + p.offset, c.length * p.row));
      }
    }
    group.gather_send = at::Tensor();
    group.gather_recv = at::Tensor();
    group.gathered = true;
  }

  void release(size_t g) {
    Group& group = groups[g];
    if (group.gather_recv.defined()) {  // a prefetch nobody used
      account(group.gather);
      group.gather_send = at::Tensor();
      group.gather_recv = at::Tensor();
    }
    if (!group.gathered) return;
    for (size_t i : group.params) release_storage(params[i].local);
    group.gathered = false;
  }

  // The post-accumulate-grad hook of parameter i: its gradient of this backward is complete.
  void on_gradient(size_t i, const at::Tensor& param) {
    at::Tensor grad = param.grad();
    if (!grad.defined()) return;
    at::NoGradGuard no_grad;
    Param& p = params[i];
    Group& group = groups[p.group];
    TORCH_CHECK(!p.got_gradient, "fully_shard: parameter '", p.name, "' got two gradients in one backward");
    if (is_dtensor(grad)) {
      if (placements_of(grad) != placements_of(p.param)) grad = redistribute(grad, placements_of(p.param));
      grad = to_local(grad);
    }
    if (!group.gradients.defined()) {
      const at::ScalarType reduce = options.reduce_dtype.value_or(p.shard_local.scalar_type());
      group.gradients = at::zeros({n * group.segment}, grad.options().dtype(reduce));
    }
    const at::Tensor flat = grad.reshape({-1});
    for (int64_t r = 0; r < n; ++r) {
      const ChunkRange c = chunk_range(p.rows, n, r);
      if (c.length == 0) continue;
      group.gradients.narrow(0, r * group.segment + p.offset, c.length * p.row)
          .copy_(flat.narrow(0, c.offset * p.row, c.length * p.row));
    }
    param.mutable_grad().reset();  // the unsharded gradient lives only until here
    p.got_gradient = true;
    if (++group.gradients_in == group.params.size()) reduce(p.group);
  }

  void reduce(size_t g) {
    // One reduce-scatter in flight while the next group's gradients are produced (FSDP2's
    // order): waiting for the older one first bounds the unsharded gradients held.
    while (!reductions.empty()) finish_oldest_reduction();
    Group& group = groups[g];
    Reduction r{g, PendingCollective(), group.gradients, at::empty({group.segment}, group.gradients.options())};
    group.gradients = at::Tensor();
    r.pending = PendingCollective::start_reduce_scatter(*shard_comm, r.send, r.recv);
    ++stats.reduce_scatters;
    if (n > 1) stats.bytes_sent += r.send.numel() * static_cast<int64_t>(r.send.element_size());
    reductions.push_back(std::move(r));
    release(g);  // every parameter of the group has its gradient: backward reads them no more
  }

  void finish_oldest_reduction() {
    Reduction r = std::move(reductions.front());
    reductions.pop_front();
    account(r.pending);
    at::NoGradGuard no_grad;
    if (replicate_comm) replicate_comm->all_reduce_(r.recv, ReduceOp::Sum);
    for (size_t i : groups[r.group].params) {
      Param& p = params[i];
      const at::Tensor piece =
          r.recv.narrow(0, p.offset, p.mine.length * p.row).view(p.shard_local.sizes()).to(p.shard_local.scalar_type());
      if (p.shard.grad().defined()) {
        to_local(p.shard.grad()).add_(piece);
      } else {
        FromLocalOptions o;
        o.shape = p.shard.sizes().vec();
        o.stride = p.shard.strides().vec();
        p.shard.mutable_grad() = DTensor::from_local(piece, mesh_of(p.shard), placements_of(p.shard), o);
      }
    }
  }
};

FullyShardedParameters::FullyShardedParameters(const std::vector<NamedParameters>& groups, const DeviceMesh& mesh,
                                               FullyShardOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.mesh = mesh;
  m.options = options;
  const auto has_dim = [&](const std::string& name) {
    for (const auto& d : mesh.dim_names())
      if (d == name) return true;
    return false;
  };
  if (!has_dim("dp_shard")) {
    throw std::invalid_argument("fully_shard: expected a mesh with a \"dp_shard\" dim, got " + mesh.str());
  }
  m.shard_comm = &mesh.comm(mesh.mesh_dim_index("dp_shard"));
  if (has_dim("dp_replicate") && mesh.size(mesh.mesh_dim_index("dp_replicate")) > 1)
    m.replicate_comm = &mesh.comm(mesh.mesh_dim_index("dp_replicate"));
  m.n = m.shard_comm->size();
  m.rank = m.shard_comm->rank();
  const std::optional<DeviceMesh> tp_mesh = has_dim("tp") ? std::optional<DeviceMesh>(mesh["tp"]) : std::nullopt;
  const DeviceMesh shard_mesh = mesh["dp_shard"];
  std::optional<DeviceMesh> tp_and_shard_mesh;
  if (tp_mesh) tp_and_shard_mesh = mesh.slice({"tp", "dp_shard"});
  std::set<const c10::StorageImpl*> storages;
  at::NoGradGuard no_grad;
  for (const NamedParameters& named : groups) {
    Impl::Group group;
    for (const auto& [name, param] : named) {
      if (!param.requires_grad()) {
        throw std::invalid_argument("fully_shard: parameter '" + name + "' does not require a gradient");
      }
      Impl::Param p;
      p.name = name;
      p.param = param;
      p.group = m.groups.size();
      Placements placements{Placement::shard(0)};
      DeviceMesh leaf_mesh = shard_mesh;
      if (is_dtensor(param)) {
        const Placements& tp_placements = placements_of(param);
        if (!tp_mesh || !(mesh_of(param) == *tp_mesh) || tp_placements.size() != 1 || tp_placements[0].is_partial()) {
          throw std::invalid_argument("fully_shard: parameter '" + name + "' is a DTensor on " + mesh_of(param).str() +
                                      " with placements " + layout_of(param).str() +
                                      "; expected a Shard or Replicate DTensor on the mesh's \"tp\" dim");
        }
        placements = {tp_placements[0], Placement::shard(0)};
        leaf_mesh = *tp_and_shard_mesh;
        p.local = to_local(param);
      } else {
        p.local = param;
      }
      if (!p.local.is_contiguous() || p.local.dim() == 0) {
        throw std::invalid_argument("fully_shard: parameter '" + name +
                                    "' must be contiguous with at least one dim, got local shape " +
                                    c10::str(p.local.sizes()));
      }
      if (!storages.insert(p.local.storage().unsafeGetStorageImpl()).second) {
        throw std::invalid_argument("fully_shard: parameter '" + name +
                                    "' shares its storage with another parameter; each must own its own");
      }
      if (!group.params.empty() && group.compute_dtype != p.local.scalar_type()) {
        throw std::invalid_argument("fully_shard: parameter '" + name + "' is " +
                                    std::string(c10::toString(p.local.scalar_type())) + ", the others of its group " +
                                    c10::toString(group.compute_dtype));
      }
      group.compute_dtype = p.local.scalar_type();
      p.rows = p.local.size(0);
      p.row = p.rows > 0 ? p.local.numel() / p.rows : 0;
      if (p.rows == 0) {
        p.row = 1;
        for (int64_t d = 1; d < p.local.dim(); ++d) p.row *= p.local.size(d);
      }
      const int64_t chunk = (p.rows + m.n - 1) / m.n;
      p.mine = chunk_range(p.rows, m.n, m.rank);
      p.offset = group.segment;
      group.segment += chunk * p.row;
      const at::ScalarType shard_dtype =
          at::isReducedFloatingType(p.local.scalar_type()) ? at::kFloat : p.local.scalar_type();
      p.shard_local = p.local.narrow(0, p.mine.offset, p.mine.length)
                          .to(shard_dtype, /*non_blocking=*/false,
                              /*copy=*/true);
      FromLocalOptions o;
      o.shape = param.sizes().vec();
      o.stride = hyper_parallel::contiguous_strides(param.sizes());
      p.shard = DTensor::from_local(p.shard_local, leaf_mesh, placements, o).detach();
      p.shard.set_requires_grad(true);
      group.params.push_back(m.params.size());
      m.shards.push_back(p.shard);
      m.names.push_back(name);
      m.params.push_back(std::move(p));
    }
    m.groups.push_back(std::move(group));
  }
  for (size_t g = 0; g < m.groups.size(); ++g) {
    m.groups[g].gathered = true;  // the parameters hold their values: release them
    m.release(g);
  }
  for (size_t i = 0; i < m.params.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(m.params[i].param,
                                                   std::make_unique<Impl::GradientTaken>(impl_.get(), i));
  }
}

FullyShardedParameters::~FullyShardedParameters() {
  for (auto& p : impl_->params) torch::autograd::impl::set_post_acc_grad_hooks(p.param, nullptr);
}

const std::vector<at::Tensor>& FullyShardedParameters::shards() const { return impl_->shards; }
const std::vector<std::string>& FullyShardedParameters::names() const { return impl_->names; }
FullyShardStats FullyShardedParameters::stats() const { return impl_->stats; }

void FullyShardedParameters::before_forward() {
  impl_->ensure_gathered(0);
  if (impl_->groups.size() > 1) impl_->start_gather(1);
}

void FullyShardedParameters::before_block(int64_t index) {
  const size_t g = static_cast<size_t>(index) + 1;
  TORCH_CHECK(g < impl_->groups.size(), "fully_shard: block ", index, " has no parameter group (",
              impl_->groups.size() - 1, " blocks)");
  impl_->ensure_gathered(g);
  if (g + 1 < impl_->groups.size()) impl_->start_gather(g + 1);
}

void FullyShardedParameters::after_block(int64_t index, const at::Tensor& output) {
  const size_t g = static_cast<size_t>(index) + 1;
  const bool backward_follows = at::GradMode::is_enabled() && output.requires_grad();
  if (backward_follows) {
    Impl* impl = impl_.get();
    // The output's gradient arrives just before the block's backward runs: gather its
    // parameters (if freed) and start the previous block's gather.
    output.register_hook([impl, g](const at::Tensor&) {
      impl->ensure_gathered(g);
      if (g > 1) impl->start_gather(g - 1);
    });
  }
  if (!backward_follows || impl_->options.reshard_after_forward) impl_->release(g);
}

void FullyShardedParameters::finish_backward() {
  Impl& m = *impl_;
  while (!m.reductions.empty()) m.finish_oldest_reduction();
  std::string missing;
  for (auto& p : m.params) {
    if (!p.got_gradient && missing.empty()) missing = p.name;
    p.got_gradient = false;
  }
  for (auto& g : m.groups) {
    g.gradients = at::Tensor();
    g.gradients_in = 0;
  }
  reshard();
  TORCH_CHECK(missing.empty(), "fully_shard: parameter '", missing,
              "' got no gradient in this backward; every sharded parameter must take part in the loss (its "
              "group's gradients are reduce-scattered together)");
}

void FullyShardedParameters::reshard() {
  for (size_t g = 0; g < impl_->groups.size(); ++g) impl_->release(g);
}

void FullyShardedParameters::gather_all() {
  for (size_t g = 0; g < impl_->groups.size(); ++g) impl_->ensure_gathered(g);
}

}  // namespace hyper_parallel
