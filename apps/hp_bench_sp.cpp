// hp-bench-sp: per-rank memory and time of one Llama forward + backward (loss parallel on
// the head) under the plain TP plan and under sequence parallel, same model, batch and rank.
//
//   hp-run --nproc-per-node 2 build/bin/hp-bench-sp [--dim 256] [--layers 4] [--heads 8]
//          [--vocab 8192] [--batch 2] [--seq 512] [--iters 2] [--threads 1] [--device cpu|cuda]
//
// Per plan, after one warm-up step (so parameter gradients already exist and are not
// counted), the largest value over the ranks of:
//   saved     memory held when the forward (loss included) returns: the activations
//             autograd keeps for backward, the quantity sequence parallel shrinks
//   peak      the peak above the start of the step during forward + backward
// Memory: the CPU through the counting wrapper of LibTorch's allocator (bench/memory_probe.h;
// each rank is its own process), a GPU through its caching allocator's statistics.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

#include "bench/memory_probe.h"
#include "llama_bench_args.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/models/llama.h"

namespace hp = hyper_parallel;
namespace F = torch::nn::functional;

namespace {

using Args = hp::bench::LlamaBenchArgs;
using hp::bench::max_over_ranks;

struct Measure {
  double saved_mb = 0, peak_mb = 0, ms = 0, loss = 0;
};

Measure measure(const Args& a, const hp::DeviceMesh& mesh, bool sequence_parallel) {
  const hp::LlamaArgs la = a.llama();
  hp::Llama model(la);
  model->init_weights(1);
  model->to(mesh.device());
  hp::parallelize_llama(model, mesh, /*loss_parallel=*/true, sequence_parallel);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor tokens =
      at::randint(la.vocab_size, {a.n.at("batch"), la.max_seq_len}, gen, at::kLong).to(mesh.device());
  const at::Tensor targets =
      at::randint(la.vocab_size, {a.n.at("batch"), la.max_seq_len}, gen, at::kLong).to(mesh.device());
  const c10::Device device = mesh.device();
  Measure m;
  for (int64_t i = 0; i <= a.n.at("iters"); ++i) {  // the first one warms up and allocates the gradients
    hp::bench::synchronize(device);
    const int64_t before = hp::bench::current_memory_bytes(device);
    hp::bench::reset_peak_memory(device);
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor loss;
    {
      hp::LossParallelGuard guard;
      loss = F::cross_entropy(model->forward(tokens).flatten(0, 1), targets.flatten());
    }
    hp::bench::synchronize(device);
    const int64_t saved = hp::bench::current_memory_bytes(device) - before;
    loss.backward();
    hp::bench::synchronize(device);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i == 0) continue;
    m.saved_mb = std::max(m.saved_mb, static_cast<double>(saved) / (1 << 20));
    m.peak_mb = std::max(m.peak_mb, static_cast<double>(hp::bench::peak_memory_bytes(device) - before) / (1 << 20));
    m.ms += ms / static_cast<double>(a.n.at("iters"));
    m.loss = hp::full_tensor(loss).item<double>();
  }
  m.saved_mb = max_over_ranks(mesh, m.saved_mb);
  m.peak_mb = max_over_ranks(mesh, m.peak_mb);
  m.ms = max_over_ranks(mesh, m.ms);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const auto bench = hp::bench::start_llama_bench("hp-bench-sp", argc, argv, Args{});
  if (!bench) return 2;
  const Args& a = bench->args;
  const hp::DeviceMesh& mesh = bench->mesh;
  const int64_t tp = mesh.size();
  const Measure plain = measure(a, mesh, false);
  const Measure sp = measure(a, mesh, true);
  if (mesh.get_rank() == 0) {
    std::printf("llama dim %lld, %lld layers, %lld heads, vocab %lld, batch %lld x seq %lld, TP %lld, %s, float32\n",
                (long long)a.n.at("dim"), (long long)a.n.at("layers"), (long long)a.n.at("heads"),
                (long long)a.n.at("vocab"), (long long)a.n.at("batch"), (long long)a.n.at("seq"), (long long)tp,
                a.device.c_str());
    std::printf("%-20s %12s %12s %10s %10s\n", "plan", "saved MiB", "peak MiB", "ms", "loss");
    std::printf("%-20s %12.1f %12.1f %10.1f %10.6f\n", "TP", plain.saved_mb, plain.peak_mb, plain.ms, plain.loss);
    std::printf("%-20s %12.1f %12.1f %10.1f %10.6f\n", "TP + SP", sp.saved_mb, sp.peak_mb, sp.ms, sp.loss);
    std::printf(
        "(per rank, the largest over ranks; saved: held when the forward returns; peak: above the step's "
        "start during forward + backward; ms: mean of %lld steps after one warm-up)\n",
        (long long)a.n.at("iters"));
  }
  hp::destroy_process_group();
  return 0;
}
