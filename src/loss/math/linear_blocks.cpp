// linear_blocks.h: the head's matmul and a fused loss's statistics or gradient, a block at a time.
#include "loss/math/linear_blocks.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/loss/loss_parallel.h"
#include "loss/kernel/cross_entropy_cpu_kernel.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/gradient_buffer.h"

namespace hyper_parallel {

namespace {

// bf16/fp16 accumulate the weight gradient of one vocabulary block in fp32: blocks of this
// many classes keep that accumulator small.
constexpr int64_t kLowPrecisionVocabBlock = 4096;

// Calls fn(start, length) over [0, total) in steps of `step`; once with length 0 when
// total is 0 (an empty vocabulary shard still contributes its -inf statistics).
template <typename Fn>
void for_blocks(int64_t total, int64_t step, Fn&& fn) {
  if (total == 0) return fn(int64_t{0}, int64_t{0});
  for (int64_t s = 0; s < total; s += step) fn(s, std::min(step, total - s));
}

// Storage for one logits block, reused by every block of a call. On the CPU it is the
// thread's cached gradient buffer (gradient_buffer.h): a fresh multi-MiB tensor per block
// faults in new pages every time (hp-bench --linear showed it as a large part of the step).
at::Tensor block_buffer(const LinearBlocks& b, const at::Tensor& like) {
  return like.device().is_cpu() ? reusable_gradient_buffer(b.tokens, b.vocab, like.scalar_type())
                                : at::empty({b.tokens, b.vocab}, like.options());
}

// A contiguous [rows, cols] tensor at the start of `buffer`'s storage.
at::Tensor view_of(const at::Tensor& buffer, int64_t rows, int64_t cols) {
  return buffer.view({-1}).narrow(0, 0, rows * cols).view({rows, cols});
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_placeholders(const at::Tensor& hidden,
                                                                   const at::Tensor& local_weight,
                                                                   int64_t ignore_index) {
  const at::Tensor h = hidden.dim() == 2 ? hidden : at::zeros({0, 0}, hidden.options());
  const at::Tensor w = local_weight.dim() == 2 ? local_weight : at::zeros({0, h.size(1)}, hidden.options());
  return {h, w, at::full({h.size(0)}, ignore_index, hidden.options().dtype(at::kLong))};
}

std::string describe_input(const at::Tensor& t) {
  if (auto* impl = dtensor_impl(t)) {
    return "a DTensor " + to_string(impl->layout().placements()) + " on " + impl->layout().mesh().str() + " of shape " +
           c10::str(t.sizes());
  }
  return "a plain tensor of shape " + c10::str(t.sizes());
}

LinearHead linear_head(const at::Tensor& hidden, const at::Tensor& weight, const std::string& op) {
  TORCH_CHECK(weight.dim() == 2, op, ": expected the weight [V, dim], got ", describe_input(weight));
  LinearHead head;
  if (auto* impl = dtensor_impl(weight)) {
    const Layout& l = impl->layout();
    if (l.mesh().ndim() != 1 || !l.placements()[0].is_shard(0)) {
      throw LossParallelLayoutError(op +
                                    ": expected the weight to be the ColwiseParallel head, a DTensor [Shard(0)] "
                                    "on a 1-D tensor-parallel mesh (or a plain tensor), got " +
                                    describe_input(weight));
    }
    head.weight_layout = l;
    head.w = impl->local();
    head.shard = ClassShard{&l.mesh().comm(0), l.local_offset()[0], l.local_shape()[0], l.shape()[0]};
  } else {
    head.w = weight;
    head.shard = ClassShard{nullptr, 0, weight.size(0), weight.size(0)};
  }
  if (auto* impl = dtensor_impl(hidden)) {
    const Layout& l = impl->layout();
    if (!l.is_replicated() || !head.weight_layout || !(l.mesh() == head.weight_layout->mesh())) {
      throw LossParallelLayoutError(op +
                                    ": expected hidden to be a plain tensor or a Replicate DTensor on the "
                                    "weight's mesh, got " +
                                    describe_input(hidden) + " (weight: " + describe_input(weight) + ")");
    }
    head.hidden_layout = l;
    head.h = impl->local();
  } else {
    head.h = hidden;
  }
  return head;
}

LinearBlocks linear_block_sizes(int64_t chunk_tokens, int64_t vocab_block, int64_t tokens, int64_t local_classes,
                                at::ScalarType dtype, int64_t block_elements) {
  LinearBlocks b;
  const bool low = compute_type(dtype) != dtype;
  b.vocab = vocab_block > 0 ? vocab_block : low ? kLowPrecisionVocabBlock : local_classes;
  b.vocab = std::max<int64_t>(1, std::min(b.vocab, local_classes));
  b.tokens = chunk_tokens > 0 ? chunk_tokens : std::max<int64_t>(1, block_elements / b.vocab);
  b.tokens = std::max<int64_t>(1, std::min(b.tokens, tokens));
  return b;
}

at::Tensor linear_block_stats(const FusedCrossEntropy& ce, const at::Tensor& h, const at::Tensor& w,
                              const ClassShard& shard, const LinearBlocks& blocks) {
  const int64_t T = h.size(0), Vl = w.size(0);
  at::Tensor stats = at::empty({ce_kernel::kStats, T}, h.options().dtype(compute_type(h.scalar_type())));
  at::NoGradGuard no_grad;
  const at::Tensor tile = block_buffer(blocks, h);
  for_blocks(T, blocks.tokens, [&](int64_t r0, int64_t n) {
    const at::Tensor hc = h.narrow(0, r0, n);
    at::Tensor acc;
    for_blocks(Vl, blocks.vocab, [&](int64_t c0, int64_t nc) {
      at::Tensor logits = view_of(tile, n, nc);
      at::mm_out(logits, hc, w.narrow(0, c0, nc).t());
      const at::Tensor s = fused_cross_entropy_block_stats(ce, logits, r0, c0, shard);
      if (acc.defined())
        merge_block_stats(ce, acc, s);
      else
        acc = s;
    });
    stats.narrow(1, r0, n).copy_(acc);
  });
  return stats;
}

// The weight gradient's vocabulary blocks in the outer loop: each block's accumulator is
// finished before the next starts.
std::pair<at::Tensor, at::Tensor> linear_block_gradients(const FusedCrossEntropy& ce,
                                                         const FusedCrossEntropyCoefficients& co, const at::Tensor& h,
                                                         const at::Tensor& w, const ClassShard& shard,
                                                         const LinearBlocks& blocks, bool want_h, bool want_w) {
  const at::ScalarType dt = h.scalar_type(), ct = compute_type(dt);
  const bool low = ct != dt;
  const int64_t T = h.size(0), D = h.size(1), Vl = w.size(0);
  // Accumulators in the compute type: bf16/fp16 gradients are summed over blocks in fp32.
  at::Tensor gh = want_h ? at::zeros({T, D}, h.options().dtype(ct)) : at::Tensor();
  at::Tensor gw = want_w ? at::empty({Vl, D}, w.options()) : at::Tensor();
  at::Tensor gw_block =
      want_w && low ? at::empty({std::min(blocks.vocab, Vl), D}, w.options().dtype(ct)) : at::Tensor();
  // float16 products of one block can overflow where the whole sum does not (the
  // gradient's terms cancel over all classes, not over one block's): they are formed in
  // float. bfloat16 has float's range.
  const bool wide_products = dt == at::kHalf;
  // bfloat16 products of one block, before they are added to the fp32 accumulators.
  at::Tensor gh_product = want_h && low && !wide_products ? at::empty({blocks.tokens, D}, h.options()) : at::Tensor();
  at::Tensor gw_product = want_w && low && !wide_products ? at::empty({blocks.vocab, D}, w.options()) : at::Tensor();
  const at::Tensor tile = block_buffer(blocks, h);
  for_blocks(Vl, blocks.vocab, [&](int64_t c0, int64_t nc) {
    if (nc == 0) return;
    const at::Tensor wb = w.narrow(0, c0, nc);
    const at::Tensor wb_wide = wide_products ? wb.to(ct) : at::Tensor();
    at::Tensor acc = want_w ? (low ? gw_block.narrow(0, 0, nc) : gw.narrow(0, c0, nc)) : at::Tensor();
    if (acc.defined()) acc.zero_();
    for_blocks(T, blocks.tokens, [&](int64_t r0, int64_t n) {
      const at::Tensor hc = h.narrow(0, r0, n);
      at::Tensor d = view_of(tile, n, nc);
      at::mm_out(d, hc, wb.t());  // the block's logits, then d loss / d logits over them
      fused_cross_entropy_block_gradient(ce, co, d, d, r0, c0, shard);
      const at::Tensor d_wide = wide_products ? d.to(ct) : at::Tensor();
      if (want_h) {
        at::Tensor rows = gh.narrow(0, r0, n);
        if (wide_products) {
          rows.addmm_(d_wide, wb_wide);
        } else if (low) {
          at::Tensor product = view_of(gh_product, n, D);
          rows.add_(at::mm_out(product, d, wb));
        } else {
          rows.addmm_(d, wb);
        }
      }
      if (want_w) {
        if (wide_products) {
          acc.addmm_(d_wide.t(), hc.to(ct));
        } else if (low) {
          at::Tensor product = view_of(gw_product, nc, D);
          acc.add_(at::mm_out(product, d.t(), hc));
        } else {
          acc.addmm_(d.t(), hc);
        }
      }
    });
    if (want_w && low) gw.narrow(0, c0, nc).copy_(acc);
  });
  if (want_h) {
    // Each rank has its vocabulary shard's part of d loss / d hidden: the sum over TP is
    // the gradient, as the unfused ColwiseParallel head's Partial -> Replicate gives.
    if (shard.comm) shard.comm->all_reduce_(gh, ReduceOp::Sum);
    gh = gh.to(dt);
  }
  return {gh, gw};
}

}  // namespace hyper_parallel
