#include "train/parallel/data_parallel_reducer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include "compat/autograd_compat.h"
#include "hyper_parallel/core/pending_collective.h"
#include "train/parallel/local_piece.h"

namespace hyper_parallel::train {

namespace {

// Gloo cannot sum bfloat16 (and a float32 sum of bfloat16 values is exact up to float32).
at::ScalarType wire_dtype(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf ? at::kFloat : t; }

}  // namespace

struct DataParallelReducer::Impl {
  struct Slot {
    std::string name;
    at::Tensor param;
    at::Tensor holder;  // whose .grad accumulates and receives the sum: param, or its master
    size_t bucket = 0;
    int64_t offset = 0, numel = 0;
    bool ready = false;
  };
  struct Bucket {
    at::TensorOptions options;  // of the wire: the gradients' dtype, float32 for bfloat16
    int64_t numel = 0;
    at::Tensor flat;
    std::vector<size_t> slots;
    size_t ready = 0;
    PendingCollective pending;
  };

  DeviceMesh mesh;
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  size_t next_to_send = 0;
  bool armed = false;

  // Called when this backward has accumulated into the parameter's .grad (not from a tensor
  // hook, which an activation checkpoint's recompute fires as well when it captures the
  // parameters' gradients).
  void on_gradient(size_t i) {
    if (!armed) return;
    at::NoGradGuard no_grad;
    Slot& s = slots[i];
    TORCH_CHECK(!s.ready, "data parallel: parameter '", s.name,
                "' got two gradients in one backward; "
                "a parameter used twice must be so in one graph (DataParallelReducer sends each once)");
    Bucket& b = buckets[s.bucket];
    at::Tensor dst = b.flat.narrow(0, s.offset, s.numel);
    // The parameter's .grad: this backward's gradient plus, when the parameter holds them,
    // the earlier micro-batches'. Another holder (the float32 masters) has those in its own.
    dst.copy_(local_or_plain(s.param.grad()).reshape({-1}));
    if (!s.holder.is_same(s.param) && s.holder.grad().defined()) {
      dst.add_(local_or_plain(s.holder.grad()).reshape({-1}));
    }
    s.ready = true;
    ++b.ready;
    send_ready_buckets();
  }

  // Buckets go out in index order on every replica: a collective order that does not
  // depend on the order the hooks happened to run in.
  void send_ready_buckets() {
    while (next_to_send < buckets.size() && buckets[next_to_send].ready == buckets[next_to_send].slots.size()) {
      Bucket& b = buckets[next_to_send++];
      b.pending = PendingCollective::start_all_reduce(mesh.comm(0), b.flat);
    }
  }
};

DataParallelReducer::DataParallelReducer(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                                         DeviceMesh dp_mesh, int64_t bucket_bytes,
                                         const std::vector<at::Tensor>& gradient_holders)
    : impl_(std::make_unique<Impl>()) {
  TORCH_CHECK(dp_mesh.defined() && dp_mesh.ndim() == 1, "DataParallelReducer: expected a 1-D data-parallel mesh");
  TORCH_CHECK(bucket_bytes > 0, "DataParallelReducer: bucket_bytes must be > 0, got ", bucket_bytes);
  TORCH_CHECK(gradient_holders.empty() || gradient_holders.size() == named_parameters.size(),
              "DataParallelReducer: expected no gradient holders or one per parameter (", named_parameters.size(),
              "), got ", gradient_holders.size());
  Impl& m = *impl_;
  m.mesh = std::move(dp_mesh);
  for (size_t i = 0; i < named_parameters.size(); ++i) {
    const auto& item = named_parameters[i];
    if (!item.value().requires_grad()) continue;
    Impl::Slot s;
    s.name = item.key();
    s.param = item.value();
    s.holder = gradient_holders.empty() ? item.value() : gradient_holders[i];
    s.numel = local_or_plain(item.value()).numel();
    TORCH_CHECK(local_or_plain(s.holder).sizes() == local_or_plain(s.param).sizes(),
                "DataParallelReducer: the gradient holder of '", s.name, "' has local shape ",
                local_or_plain(s.holder).sizes(), ", its parameter ", local_or_plain(s.param).sizes());
    m.slots.push_back(std::move(s));
  }
  // Reverse order: the last layers' gradients come first in backward. A bucket takes
  // parameters of one wire dtype and device until the next would take it past bucket_bytes
  // (a parameter larger than that gets a bucket of its own). Sums go to the holders' dtype.
  for (size_t k = m.slots.size(); k-- > 0;) {
    Impl::Slot& s = m.slots[k];
    const at::Tensor local = local_or_plain(s.holder);
    const at::TensorOptions wire = local.options().dtype(wire_dtype(local.scalar_type()));
    const auto element = static_cast<int64_t>(wire.dtype().itemsize());
    Impl::Bucket* b = m.buckets.empty() ? nullptr : &m.buckets.back();
    if (!b || (b->numel + s.numel) * element > bucket_bytes || wire.dtype() != b->options.dtype() ||
        wire.device() != b->options.device()) {
      b = &m.buckets.emplace_back();
      b->options = wire;
    }
    s.bucket = m.buckets.size() - 1;
    s.offset = b->numel;
    b->numel += s.numel;
    b->slots.push_back(k);
  }
  for (auto& b : m.buckets) b.flat = at::empty({b.numel}, b.options);
  for (size_t k = 0; k < m.slots.size(); ++k) {
    Impl* impl = impl_.get();
    compat::set_post_accumulate_grad_hook(m.slots[k].param, [impl, k](const at::Tensor&) { impl->on_gradient(k); });
  }
}

DataParallelReducer::~DataParallelReducer() {
  for (auto& b : impl_->buckets) {
    try {
      b.pending.wait();  // the buffer must outlive the transfer
    } catch (...) {
    }
  }
  for (auto& s : impl_->slots) compat::set_post_accumulate_grad_hook(s.param, nullptr);
}

int64_t DataParallelReducer::bucket_count() const { return static_cast<int64_t>(impl_->buckets.size()); }

void DataParallelReducer::arm() {
  Impl& m = *impl_;
  m.armed = true;
  m.next_to_send = 0;
  for (auto& s : m.slots) s.ready = false;
  for (auto& b : m.buckets) b.ready = 0;
}

void DataParallelReducer::finish() {
  Impl& m = *impl_;
  TORCH_CHECK(m.armed, "DataParallelReducer::finish() without arm() before the step's last backward");
  m.armed = false;
  for (const auto& s : m.slots) {
    // Every replica runs the same model: a missing gradient here is missing everywhere,
    // but the buckets can only be sent whole, so say which parameter it is.
    TORCH_CHECK(s.ready, "data parallel: parameter '", s.name,
                "' got no gradient in this step's backward; "
                "every trainable parameter must take part in the loss (freeze it with requires_grad(false) "
                "otherwise)");
  }
  at::NoGradGuard no_grad;
  for (auto& b : m.buckets) {
    b.pending.wait();
    for (size_t k : b.slots) {
      Impl::Slot& s = m.slots[k];
      if (!s.holder.is_same(s.param)) {
        // The parameter's gradient is in the sum: the holder's .grad replaces it.
        s.param.mutable_grad() = at::Tensor();
        if (!s.holder.grad().defined()) s.holder.mutable_grad() = at::zeros_like(s.holder);
      }
      at::Tensor grad = local_or_plain(s.holder.grad());
      grad.copy_(b.flat.narrow(0, s.offset, s.numel).view(grad.sizes()));
    }
  }
}

}  // namespace hyper_parallel::train
