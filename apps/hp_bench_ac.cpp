// hp-bench-ac: per-rank memory and time of one Llama forward + backward (TP, loss parallel on
// the head) without activation checkpointing, with every block checkpointed (full) and with
// every 2nd block (selective 2): same model, batch and rank.
//
//   hp-run --nproc-per-node 2 build/bin/hp-bench-ac [--dim 256] [--layers 4] [--heads 8]
//          [--vocab 8192] [--batch 2] [--seq 1024] [--iters 2] [--threads 1] [--device cpu|cuda]
//
// Per mode, after one warm-up step (so parameter gradients already exist and are not
// counted), the largest value over the ranks of:
//   saved     memory held when the forward (loss included) returns: what backward will read
//   peak      the peak above the start of the step during forward + backward
//   ms        the step's wall time, the fastest of --iters (the modes take turns step by step)
// and this rank's TP collectives per step. The loss and the gradient norm are printed beside
// no checkpointing's (the relative difference): the same computation, recomputed.
// Memory: the CPU through the counting wrapper of LibTorch's allocator (bench/memory_probe.h;
// each rank is its own process), a GPU through its caching allocator's statistics.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

#include "bench/memory_probe.h"
#include "llama_bench_args.h"
#include "hyper_parallel/nn/activation_checkpoint.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/models/llama.h"

namespace hp = hyper_parallel;
namespace F = torch::nn::functional;

namespace {

using Args = hp::bench::LlamaBenchArgs;
using hp::bench::max_over_ranks;

struct Measure {
  double saved_mb = 0, peak_mb = 0, ms = 0, loss = 0, grad_norm = 0;
  hp::CollectiveCounts collectives;
};

double grad_norm(hp::Llama& model) {
  double sum = 0;
  for (const auto& p : model->parameters()) {
    const at::Tensor g = hp::is_dtensor(p.grad()) ? hp::full_tensor(p.grad()) : p.grad();
    sum += g.to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(sum);
}

struct Setup {
  hp::Llama model{nullptr};
  at::Tensor tokens, targets;
};

Setup build(const Args& a, const hp::DeviceMesh& mesh, const hp::BlockCheckpointing& policy) {
  const hp::LlamaArgs la = a.llama();
  Setup s;
  s.model = hp::Llama(la);
  s.model->init_weights(1);
  s.model->to(mesh.device());
  hp::parallelize_llama(s.model, mesh, /*loss_parallel=*/true);
  s.model->set_block_checkpointing(policy);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  s.tokens = at::randint(la.vocab_size, {a.n.at("batch"), la.max_seq_len}, gen, at::kLong).to(mesh.device());
  s.targets = at::randint(la.vocab_size, {a.n.at("batch"), la.max_seq_len}, gen, at::kLong).to(mesh.device());
  return s;
}

// One forward + backward of `s`, folded into `m` (the first, a warm-up that allocates the
// gradients, is not).
void step(Setup& s, const hp::DeviceMesh& mesh, bool warm_up, Measure& m) {
  const c10::Device device = mesh.device();
  hp::bench::synchronize(device);
  const int64_t before = hp::bench::current_memory_bytes(device);
  hp::bench::reset_peak_memory(device);
  hp::reset_collective_counts();
  const auto t0 = std::chrono::steady_clock::now();
  at::Tensor loss;
  {
    hp::LossParallelGuard guard;
    loss = F::cross_entropy(s.model->forward(s.tokens).flatten(0, 1), s.targets.flatten());
  }
  hp::bench::synchronize(device);
  const int64_t saved = hp::bench::current_memory_bytes(device) - before;
  loss.backward();
  hp::bench::synchronize(device);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (warm_up) return;
  m.collectives = hp::collective_counts();
  m.saved_mb = std::max(m.saved_mb, static_cast<double>(saved) / (1 << 20));
  m.peak_mb = std::max(m.peak_mb, static_cast<double>(hp::bench::peak_memory_bytes(device) - before) / (1 << 20));
  m.ms = m.ms == 0 ? ms : std::min(m.ms, ms);
  m.loss = hp::full_tensor(loss).item<double>();
  m.grad_norm = grad_norm(s.model);  // accumulated over the steps: the same sum in every mode
}

}  // namespace

int main(int argc, char** argv) {
  Args defaults;
  defaults.n["seq"] = 1024;
  const auto bench = hp::bench::start_llama_bench("hp-bench-ac", argc, argv, defaults);
  if (!bench) return 2;
  const Args& a = bench->args;
  const hp::DeviceMesh& mesh = bench->mesh;
  const int64_t tp = mesh.size();
  const std::pair<const char*, hp::BlockCheckpointing> modes[] = {
      {"none", hp::block_checkpointing("none", "2")},
      {"full", hp::block_checkpointing("full", "2")},
      {"selective 2", hp::block_checkpointing("selective", "2")}};
  // The modes take turns, step by step, so that a load that changes during the run (other
  // jobs on the machine) weighs on each alike; the fastest step of each is reported.
  std::vector<Setup> setups;
  for (const auto& mode : modes) setups.push_back(build(a, mesh, mode.second));
  std::vector<Measure> results(setups.size());
  for (int64_t i = 0; i <= a.n.at("iters"); ++i) {
    for (size_t k = 0; k < setups.size(); ++k) step(setups[k], mesh, i == 0, results[k]);
  }
  for (Measure& m : results) {
    m.saved_mb = max_over_ranks(mesh, m.saved_mb);
    m.peak_mb = max_over_ranks(mesh, m.peak_mb);
    m.ms = max_over_ranks(mesh, m.ms);
  }
  if (mesh.get_rank() == 0) {
    std::printf("llama dim %lld, %lld layers, %lld heads, vocab %lld, batch %lld x seq %lld, TP %lld, %s, float32\n",
                (long long)a.n.at("dim"), (long long)a.n.at("layers"), (long long)a.n.at("heads"),
                (long long)a.n.at("vocab"), (long long)a.n.at("batch"), (long long)a.n.at("seq"), (long long)tp,
                a.device.c_str());
    std::printf("%-12s %10s %8s %10s %8s %9s %8s %20s %14s\n", "AC", "saved MiB", "x none", "peak MiB", "x none", "ms",
                "x none", "collectives/step", "loss, grad diff");
    const Measure& none = results[0];
    for (size_t i = 0; i < results.size(); ++i) {
      const Measure& r = results[i];
      const hp::CollectiveCounts& c = r.collectives;
      const std::string collectives = std::to_string(c.all_reduce) + " AR, " + std::to_string(c.all_gather) + " AG, " +
                                      std::to_string(c.reduce_scatter) + " RS";
      const double diff = std::max(std::abs(r.loss - none.loss) / std::abs(none.loss),
                                   std::abs(r.grad_norm - none.grad_norm) / none.grad_norm);
      std::printf("%-12s %10.1f %8.2f %10.1f %8.2f %9.1f %8.2f %20s %14.1e\n", modes[i].first, r.saved_mb,
                  r.saved_mb / none.saved_mb, r.peak_mb, r.peak_mb / none.peak_mb, r.ms, r.ms / none.ms,
                  collectives.c_str(), diff);
    }
    std::printf(
        "(per rank, the largest over ranks; saved: held when the forward returns; peak: above the step's start during "
        "forward + backward; ms: the fastest of %lld steps after one warm-up, the modes taking turns; collectives: "
        "rank 0's, forward + backward; "
        "loss, grad diff: relative to none, float32)\n",
        (long long)a.n.at("iters"));
  }
  hp::destroy_process_group();
  return 0;
}
