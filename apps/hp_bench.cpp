// hp-bench: speed and memory of vocabulary-parallel cross-entropy, as ratios against
// baselines measured in the same run (the machines are shared and noisy).
//
//   hp-run --nproc-per-node 2 build/bin/hp-bench [--tokens 4096] [--vocab 32000]
//          [--dtype float32|bfloat16] [--iters 5] [--device cpu|cuda] [--threads N]
//          [--vs-pytorch [--python PY]]
//
// Per rank, forward + backward of the loss on [tokens, vocab] logits:
//   single      cross_entropy on the full logits (what one process does; the baseline)
//   gather      sharded logits all-gathered, then cross_entropy (TP without loss_parallel)
//   decomposed  loss_parallel through the op routes: nll_loss(log_softmax(x)) — PyTorch's
//               structure (K1 + K2 forward), with a correct log_softmax backward
//   fused       loss_parallel's cross_entropy: the fused kernel (this project's default)
// --vs-pytorch then runs PyTorch's own loss_parallel and gather-then-cross_entropy on the
// same shapes, seeds and thread count (apps/bench_pytorch_ce.py through torchrun, after
// ours, so the two never share the cores) and prints ours / PyTorch.
// Memory is the peak above what was allocated before (the logits piece excluded): on the
// CPU through a counting wrapper of LibTorch's allocator (libhp_memory_probe, which the
// PyTorch side loads too), on a GPU from the caching allocator's statistics, on both sides.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>

#include <unistd.h>

#include "bench/memory_probe.h"
#include "hyper_parallel/hyper_parallel.h"

namespace hp = hyper_parallel;
namespace F = torch::nn::functional;

namespace {

struct Measure {
  std::string name;
  double ms = 0;
  double peak_mb = 0;
  int64_t collectives = 0;
  double loss = 0;
};

Measure run(const std::string& name, int iters, c10::Device device, const std::function<double()>& step) {
  Measure m{name};
  std::vector<double> times;
  for (int i = 0; i < iters + 1; ++i) {  // the first run warms up
    hp::reset_collective_counts();
    hp::bench::synchronize(device);
    const int64_t before = hp::bench::current_memory_bytes(device);
    hp::bench::reset_peak_memory(device);
    const auto t0 = std::chrono::steady_clock::now();
    m.loss = step();
    hp::bench::synchronize(device);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) times.push_back(ms);
    m.peak_mb = static_cast<double>(hp::bench::peak_memory_bytes(device) - before) / (1 << 20);
    m.collectives = hp::collective_counts().total();
  }
  std::sort(times.begin(), times.end());
  m.ms = times[times.size() / 2];
  return m;
}

struct Args {
  int64_t tokens = 4096, vocab = 32000;
  int iters = 5;
  int threads = 0;  // 0: ATen's choice
  std::string dtype = "float32";
  std::string device = "cpu";
  bool vs_pytorch = false;
  std::string python = HP_DEFAULT_PYTHON;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(s + " needs a value");
      return std::string(argv[++i]);
    };
    if (s == "--tokens") a.tokens = std::stoll(next());
    else if (s == "--vocab") a.vocab = std::stoll(next());
    else if (s == "--iters") a.iters = std::stoi(next());
    else if (s == "--threads") a.threads = std::stoi(next());
    else if (s == "--dtype") a.dtype = next();
    else if (s == "--device") a.device = next();
    else if (s == "--vs-pytorch") a.vs_pytorch = true;
    else if (s == "--python") a.python = next();
    else throw std::invalid_argument("unknown argument '" + s + "'; expected --tokens N --vocab V --iters K "
                                     "--threads T --dtype float32|bfloat16 --device cpu|cuda --vs-pytorch --python PY");
  }
  if (a.dtype != "float32" && a.dtype != "bfloat16") throw std::invalid_argument("--dtype: expected float32 or bfloat16, got " + a.dtype);
  if (a.device != "cpu" && a.device != "cuda") throw std::invalid_argument("--device: expected cpu or cuda, got " + a.device);
  return a;
}

// PyTorch's side, through torchrun, after ours; its JSON lines by method name.
std::map<std::string, Measure> run_pytorch(const Args& a, int64_t tp, const std::string& json_path) {
  const std::string cmd = "OMP_NUM_THREADS=" + std::to_string(std::max(a.threads, 1)) + " '" + a.python +
                          "' -m torch.distributed.run --standalone --nproc-per-node " + std::to_string(tp) + " '" +
                          HP_PYTORCH_BENCH_SCRIPT + "' --tokens " + std::to_string(a.tokens) + " --vocab " +
                          std::to_string(a.vocab) + " --dtype " + a.dtype + " --device " + a.device + " --iters " +
                          std::to_string(a.iters) + " --threads " + std::to_string(a.threads) + " --probe '" +
                          HP_MEMORY_PROBE_LIBRARY + "' --libtorch-version " + TORCH_VERSION + " --json '" + json_path +
                          "' > '" + json_path + ".log' 2>&1";
  std::map<std::string, Measure> out;
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream log(json_path + ".log");
    std::cerr << "hp-bench: the PyTorch side failed:\n" << log.rdbuf() << std::endl;
    return out;
  }
  std::ifstream in(json_path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    Measure m{j.at("name")};
    m.ms = j.at("ms");
    m.peak_mb = j.at("peak_mb").is_null() ? -1 : j.at("peak_mb").get<double>();
    m.loss = j.at("loss");
    out[m.name] = m;
  }
  return out;
}

void print_ours(const std::vector<Measure>& results, const Args& a, int64_t tp) {
  const Measure& single = results[0];
  const Measure& gather = results[1];
  std::printf("hp-bench: cross-entropy forward+backward, %lld tokens x %lld classes, %s, %s, TP %lld, %d threads per rank\n",
              static_cast<long long>(a.tokens), static_cast<long long>(a.vocab), a.dtype.c_str(), a.device.c_str(),
              static_cast<long long>(tp), at::get_num_threads());
  std::printf("%-11s %10s %10s %10s %11s %10s %10s %12s %12s\n", "method", "ms", "vs single", "vs gather",
              "peak MiB", "vs single", "vs gather", "collectives", "loss");
  for (const auto& m : results) {
    std::printf("%-11s %10.2f %9.2fx %9.2fx %11.1f %9.2fx %9.2fx %12lld %12.6f\n", m.name.c_str(), m.ms,
                m.ms / single.ms, m.ms / gather.ms, m.peak_mb, m.peak_mb / single.peak_mb,
                m.peak_mb / gather.peak_mb, static_cast<long long>(m.collectives), m.loss);
  }
  std::printf("(ratios < 1 are better; the losses must agree)\n");
}

void print_versus(const std::vector<Measure>& ours, const std::map<std::string, Measure>& theirs) {
  auto find = [&](const std::string& n) -> const Measure& {
    return *std::find_if(ours.begin(), ours.end(), [&](const Measure& m) { return m.name == n; });
  };
  std::printf("\nours / PyTorch %s (same shapes, seeds and threads; median ms and peak MiB per rank)\n", TORCH_VERSION);
  std::printf("%-36s %10s %10s %8s %10s %10s %8s\n", "comparison", "ours ms", "torch ms", "ratio", "ours MiB",
              "torch MiB", "ratio");
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"single", "single"}, {"fused", "loss_parallel"}, {"decomposed", "loss_parallel"}, {"gather", "gather"}};
  for (const auto& [o, t] : pairs) {
    auto it = theirs.find(t);
    if (it == theirs.end()) continue;
    const Measure& m = find(o);
    const Measure& p = it->second;
    const std::string label = o + " vs PyTorch " + t;
    if (p.peak_mb >= 0) {
      std::printf("%-36s %10.2f %10.2f %7.2fx %10.1f %10.1f %7.2fx\n", label.c_str(), m.ms, p.ms, m.ms / p.ms,
                  m.peak_mb, p.peak_mb, m.peak_mb / std::max(p.peak_mb, 1e-9));
    } else {
      std::printf("%-36s %10.2f %10.2f %7.2fx %10.1f %10s %8s\n", label.c_str(), m.ms, p.ms, m.ms / p.ms, m.peak_mb,
                  "n/a", "");
    }
    if (std::abs(m.loss - p.loss) > 1e-3 * std::max(1.0, std::abs(p.loss))) {
      std::printf("  WARNING: losses differ: ours %.6f, PyTorch %.6f\n", m.loss, p.loss);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "hp-bench: " << e.what() << std::endl;
    return 2;
  }
  if (!std::getenv("WORLD_SIZE")) {
    std::cerr << "hp-bench: run it through hp-run (e.g. hp-run --nproc-per-node 2 hp-bench)" << std::endl;
    return 2;
  }
  if (a.threads > 0) at::set_num_threads(a.threads);
  const at::ScalarType dtype = a.dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;
  hp_memory_probe_install();
  hp::InitOptions init;
  init.device_type = a.device;
  hp::init_process_group(init);
  auto mesh = hp::init_device_mesh(a.device, {hp::get_world_size()}, {"tp"});
  const c10::Device device = mesh.device();
  const int64_t rank = mesh.get_rank();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor full = (at::randn({a.tokens, a.vocab}, gen, at::kFloat) * 2).to(dtype).to(device);
  at::Tensor target = at::randint(a.vocab, {a.tokens}, gen, at::kLong).to(device);
  at::Tensor sharded = hp::distribute_tensor(full, mesh, {hp::Shard(1)});
  auto leaf = [](const at::Tensor& t) { return t.detach().set_requires_grad(true); };
  std::vector<Measure> results;
  results.push_back(run("single", a.iters, device, [&] {
    at::Tensor x = leaf(full);
    at::Tensor loss = F::cross_entropy(x, target);
    loss.backward();
    return loss.item<double>();
  }));
  results.push_back(run("gather", a.iters, device, [&] {
    at::Tensor x = leaf(sharded);
    at::Tensor loss = F::cross_entropy(hp::full_tensor(x), target);
    loss.backward();
    return loss.item<double>();
  }));
  results.push_back(run("decomposed", a.iters, device, [&] {
    at::Tensor x = leaf(sharded);
    auto guard = hp::loss_parallel();
    at::Tensor loss = F::nll_loss(torch::log_softmax(x, 1), target);
    loss.backward();
    return hp::full_tensor(loss).item<double>();
  }));
  results.push_back(run("fused", a.iters, device, [&] {
    at::Tensor x = leaf(sharded);
    auto guard = hp::loss_parallel();
    at::Tensor loss = F::cross_entropy(x, target);
    loss.backward();
    return hp::full_tensor(loss).item<double>();
  }));
  mesh.comm(0).barrier();
  if (rank != 0) return 0;
  print_ours(results, a, mesh.size());
  if (a.vs_pytorch) {
    // Free our tensors first: the PyTorch side runs on this machine right after.
    full = target = sharded = at::Tensor();
    const std::string json_path = "/tmp/hp-bench-pytorch-" + std::to_string(::getpid()) + ".jsonl";
    auto theirs = run_pytorch(a, mesh.size(), json_path);
    std::remove(json_path.c_str());
    std::remove((json_path + ".log").c_str());
    if (theirs.empty()) return 1;
    print_versus(results, theirs);
  }
  return 0;
}
