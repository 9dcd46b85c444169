// hp-bench --linear DIM: per rank, forward + backward of the output head and the loss on
// hidden [tokens, DIM] and the ColwiseParallel head weight [vocab, DIM] (Shard(0)):
//   head+fused   the head's matmul (Shard(-1) logits) then loss_parallel's fused cross_entropy
//   fused-linear fused_linear_cross_entropy: chunked, the logits never exist
// Peak memory is above what existed before the step (inputs and parameters), and counts the
// gradients of hidden and weight, which both produce; "working" subtracts those, leaving
// what the loss itself needs (logits, their gradient, blocks, accumulators). The
// gradient buffer the fused CE keeps between steps is counted as its own.
#include "hp_bench_linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench/memory_probe.h"
#include "hyper_parallel/loss/fused_linear_loss.h"
#include "hyper_parallel/hyper_parallel.h"
#include "loss/math/gradient_buffer.h"

namespace hp = hyper_parallel;
namespace F = torch::nn::functional;

namespace hp_bench {

namespace {

struct HeadModel : torch::nn::Module {
  HeadModel(int64_t dim, int64_t vocab) {
    output = register_module("output", torch::nn::Linear(torch::nn::LinearOptions(dim, vocab).bias(false)));
  }
  torch::nn::Linear output{nullptr};
};

struct Result {
  double ms = 0, peak_mb = 0, loss = 0;
  int64_t collectives = 0;
};

// One measured step: setup (fresh leaves, last step's gradients released) runs before and
// is not measured. Returns the step's milliseconds and sets r's peak, collectives, loss.
double measure_step(Result& r, c10::Device device, const std::function<void()>& setup,
                    const std::function<double()>& step) {
  setup();
  hp::reset_collective_counts();
  hp::bench::synchronize(device);
  const int64_t before = hp::bench::current_memory_bytes(device) - hp::cached_gradient_buffer_bytes();
  hp::bench::reset_peak_memory(device);
  const auto t0 = std::chrono::steady_clock::now();
  r.loss = step();
  hp::bench::synchronize(device);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.peak_mb = std::max(
      r.peak_mb, static_cast<double>(
                     std::max(hp::bench::peak_memory_bytes(device), hp::bench::current_memory_bytes(device)) - before) /
                     (1 << 20));
  r.collectives = hp::collective_counts().total();
  return ms;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int run_linear_bench(const LinearArgs& a, const hp::DeviceMesh& mesh) {
  const at::ScalarType dtype = a.dtype;
  const c10::Device device = mesh.device();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  HeadModel model(a.dim, a.vocab);
  {
    at::NoGradGuard no_grad;
    model.output->weight.copy_(at::randn({a.vocab, a.dim}, gen, at::kFloat) / std::sqrt(double(a.dim)) * 2);
  }
  model.to(device, dtype);
  hp::StyleOptions head;
  head.output_layouts = hp::Placements{hp::Placement::shard(-1)};
  head.use_local_output = false;
  hp::parallelize_module(model, mesh, {{"output", hp::ColwiseParallel::make(head)}});
  const at::Tensor weight = model.output->weight;  // Shard(0) DTensor [V, dim]
  const at::Tensor hidden_value = at::randn({a.tokens, a.dim}, gen, at::kFloat).to(dtype).to(device);
  at::Tensor target = at::randint(a.vocab, {a.tokens}, gen, at::kLong).to(device);
  at::Tensor hidden;
  const std::function<void()> fresh_leaves = [&] {
    hidden = hidden_value.detach().set_requires_grad(true);
    weight.mutable_grad().reset();  // allocated inside the step, by both methods
  };

  hp::FusedLinearCrossEntropyOptions o;
  o.chunk_tokens = a.chunk_tokens;
  o.vocab_block = a.vocab_block;
  const std::function<double()> unfused_step = [&] {
    at::Tensor logits = hp::parallel_forward(model.output, hidden);
    auto guard = hp::loss_parallel();
    at::Tensor loss = F::cross_entropy(logits, target);
    loss.backward();
    return hp::full_tensor(loss).item<double>();
  };
  const std::function<double()> fused_step = [&] {
    at::Tensor loss = hp::fused_linear_cross_entropy(hidden, weight, target, o);
    loss.backward();
    return hp::full_tensor(loss).item<double>();
  };
  // The two alternate, so that load from elsewhere on a shared machine affects both alike.
  // Each turn is two steps, the second measured: its cached block / gradient buffer is
  // warm, as in training (and counted as its memory), and not the other method's.
  Result unfused, fused;
  std::vector<double> unfused_ms, fused_ms;
  for (int i = 0; i < a.iters; ++i) {
    hp::release_gradient_buffers();
    measure_step(unfused, device, fresh_leaves, unfused_step);
    unfused_ms.push_back(measure_step(unfused, device, fresh_leaves, unfused_step));
    hp::release_gradient_buffers();
    measure_step(fused, device, fresh_leaves, fused_step);
    fused_ms.push_back(measure_step(fused, device, fresh_leaves, fused_step));
  }
  unfused.ms = median(unfused_ms);
  fused.ms = median(fused_ms);
  mesh.comm(0).barrier();
  if (mesh.get_rank() != 0) return 0;
  const int64_t local_vocab = hp::layout_of(weight).local_shape()[0];
  const double grads_mb = static_cast<double>((a.tokens + local_vocab) * a.dim * c10::elementSize(dtype)) / (1 << 20);
  std::printf(
      "hp-bench --linear: head + loss forward+backward, %lld tokens x dim %lld x vocab %lld (%lld per rank), "
      "%s, %s, TP %lld, %d threads per rank\n",
      static_cast<long long>(a.tokens), static_cast<long long>(a.dim), static_cast<long long>(a.vocab),
      static_cast<long long>(local_vocab), c10::toString(a.dtype), device.str().c_str(),
      static_cast<long long>(mesh.size()), at::get_num_threads());
  std::printf("%-13s %10s %12s %12s %12s %14s\n", "method", "ms", "peak MiB", "working MiB", "collectives", "loss");
  for (const auto& [name, r] : {std::pair<const char*, Result>{"head+fused", unfused}, {"fused-linear", fused}}) {
    std::printf("%-13s %10.1f %12.1f %12.1f %12lld %14.6f\n", name, r.ms, r.peak_mb, r.peak_mb - grads_mb,
                static_cast<long long>(r.collectives), r.loss);
  }
  std::printf(
      "fused-linear / head+fused: time %.3fx, peak memory %.4fx, working memory %.4fx "
      "(working = peak - the gradients of hidden and weight, %.1f MiB, which both produce)\n",
      fused.ms / unfused.ms, fused.peak_mb / unfused.peak_mb, (fused.peak_mb - grads_mb) / (unfused.peak_mb - grads_mb),
      grads_mb);
  if (std::abs(fused.loss - unfused.loss) > 1e-3 * std::max(1.0, std::abs(unfused.loss))) {
    std::printf("ERROR: the losses differ: fused-linear %.6f, head+fused %.6f\n", fused.loss, unfused.loss);
    return 1;
  }
  return 0;
}

}  // namespace hp_bench
