// hp-bench: speed and memory of vocabulary-parallel cross-entropy, as ratios against
// baselines measured in the same run (the machines are shared and noisy).
//
//   hp-run --nproc-per-node 2 build/bin/hp-bench [--tokens 4096] [--vocab 32000]
//          [--dtype float32|bfloat16] [--iters 5]
//
// Per rank, forward + backward of the loss on [tokens, vocab] logits:
//   single      cross_entropy on the full logits (what one process does; the baseline)
//   gather      sharded logits all-gathered, then cross_entropy (TP without loss_parallel)
//   decomposed  loss_parallel through the op routes: nll_loss(log_softmax(x)) — PyTorch's
//               structure (K1 + K2 forward), with a correct log_softmax backward
//   fused       loss_parallel's cross_entropy: the fused kernel (this project's default)
// Memory is the peak of bytes allocated through LibTorch's CPU allocator during forward
// and backward, above what was allocated before (the logits piece itself excluded).
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/activation.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>

#include "hyper_parallel/hyper_parallel.h"

namespace F = torch::nn::functional;

namespace {

// Counts the bytes LibTorch allocates on the CPU, to measure peak memory exactly.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) const override {
    auto* ctx = new Context{base_->allocate(n), n, this};
    const int64_t now = current_ += static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {}
    void* data = ctx->inner.get();
    const c10::Device device = ctx->inner.device();
    return {data, ctx, &release, device};
  }
  void reset_peak() const { peak_ = current_.load(); }
  int64_t current() const { return current_; }
  int64_t peak() const { return peak_; }

 private:
  struct Context {
    c10::DataPtr inner;
    size_t bytes;
    const CountingAllocator* owner;
  };
  static void release(void* p) {
    auto* ctx = static_cast<Context*>(p);
    ctx->owner->current_ -= static_cast<int64_t>(ctx->bytes);
    delete ctx;
  }
  c10::Allocator* base_;
  mutable std::atomic<int64_t> current_{0}, peak_{0};
};

CountingAllocator* counting = nullptr;

struct Measure {
  std::string name;
  double ms = 0;
  double peak_mb = 0;
  int64_t collectives = 0;
  double loss = 0;
};

Measure run(const std::string& name, int iters, const std::function<double()>& step) {
  Measure m{name};
  std::vector<double> times;
  for (int i = 0; i < iters + 1; ++i) {  // the first run warms up
    hp::reset_collective_counts();
    const int64_t before = counting->current();
    counting->reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    m.loss = step();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) times.push_back(ms);
    m.peak_mb = static_cast<double>(counting->peak() - before) / (1 << 20);
    m.collectives = hp::collective_counts().total();
  }
  std::sort(times.begin(), times.end());
  m.ms = times[times.size() / 2];
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 4096, vocab = 32000;
  int iters = 5;
  std::string dtype_name = "float32";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--tokens") tokens = std::stoll(next());
    else if (a == "--vocab") vocab = std::stoll(next());
    else if (a == "--iters") iters = std::stoi(next());
    else if (a == "--dtype") dtype_name = next();
    else {
      std::cerr << "hp-bench: unknown argument '" << a
                << "'; expected --tokens N --vocab V --iters K --dtype float32|bfloat16" << std::endl;
      return 2;
    }
  }
  const at::ScalarType dtype = dtype_name == "bfloat16" ? at::kBFloat16 : at::kFloat;
  static CountingAllocator allocator(c10::GetCPUAllocator());
  counting = &allocator;
  c10::SetCPUAllocator(&allocator, /*priority=*/100);

  if (!hp::is_initialized()) {
    if (std::getenv("WORLD_SIZE")) {
      hp::init_process_group();
    } else {
      std::cerr << "hp-bench: run it through hp-run (e.g. hp-run --nproc-per-node 2 hp-bench)" << std::endl;
      return 2;
    }
  }
  auto mesh = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"tp"});
  const int64_t rank = mesh.get_rank();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor full = (at::randn({tokens, vocab}, gen, at::kFloat) * 2).to(dtype);
  at::Tensor target = at::randint(vocab, {tokens}, gen, at::kLong);
  at::Tensor sharded = hp::distribute_tensor(full, mesh, {hp::Shard(1)});

  auto leaf = [](const at::Tensor& t) { return t.detach().set_requires_grad(true); };
  std::vector<Measure> results;
  results.push_back(run("single", iters, [&] {
    at::Tensor x = leaf(full);
    at::Tensor loss = F::cross_entropy(x, target);
    loss.backward();
    return loss.item<double>();
  }));
  results.push_back(run("gather", iters, [&] {
    at::Tensor x = leaf(sharded);
    at::Tensor loss = F::cross_entropy(hp::full_tensor(x), target);
    loss.backward();
    return loss.item<double>();
  }));
  results.push_back(run("decomposed", iters, [&] {
    at::Tensor x = leaf(sharded);
    auto guard = hp::loss_parallel();
    at::Tensor loss = F::nll_loss(torch::log_softmax(x, 1), target);
    loss.backward();
    return hp::full_tensor(loss).item<double>();
  }));
  results.push_back(run("fused", iters, [&] {
    at::Tensor x = leaf(sharded);
    auto guard = hp::loss_parallel();
    at::Tensor loss = F::cross_entropy(x, target);
    loss.backward();
    return hp::full_tensor(loss).item<double>();
  }));

  if (rank == 0) {
    const Measure& single = results[0];
    const Measure& gather = results[1];
    std::printf("hp-bench: cross-entropy forward+backward, %lld tokens x %lld classes, %s, TP %lld (per rank)\n",
                static_cast<long long>(tokens), static_cast<long long>(vocab), dtype_name.c_str(),
                static_cast<long long>(mesh.size()));
    std::printf("%-11s %10s %10s %10s %11s %10s %10s %12s %12s\n", "method", "ms", "vs single", "vs gather",
                "peak MiB", "vs single", "vs gather", "collectives", "loss");
    for (const auto& m : results) {
      std::printf("%-11s %10.1f %9.2fx %9.2fx %11.1f %9.2fx %9.2fx %12lld %12.6f\n", m.name.c_str(), m.ms,
                  m.ms / single.ms, m.ms / gather.ms, m.peak_mb, m.peak_mb / single.peak_mb,
                  m.peak_mb / gather.peak_mb, static_cast<long long>(m.collectives), m.loss);
    }
    std::printf("(ratios < 1 are better; the losses must agree)\n");
  }
  return 0;
}
