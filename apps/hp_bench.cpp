// hp-bench: speed and memory of vocabulary-parallel cross-entropy, as ratios against
// baselines measured in the same run (the machines are shared and noisy).
//
//   hp-run --nproc-per-node 2 build/bin/hp-bench [--tokens 4096] [--vocab 32000]
//          [--dtype float32|bfloat16|float16] [--iters 5] [--device cpu|cuda] [--threads N]
//          [--vs-pytorch [--python PY]] [--scaling]
//   hp-run --nproc-per-node 2 build/bin/hp-bench --linear DIM [--tokens N] [--vocab V]
//          [--chunk-tokens N] [--vocab-block N]   (apps/hp_bench_linear.cpp: fused linear +
//          cross-entropy against head matmul + fused cross-entropy)
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
// --scaling: single and fused at 1, 2, 4 ... threads per rank (up to the cores each rank has,
// at least 2, or up to --threads), then PyTorch's at each, and how each scales and ours /
// PyTorch's loss_parallel at each thread count: whether the kernels use the threads given.
// Then the roofline of the fused kernel, measured in the same run on the same threads:
// the kernel's own vectorised exp throughput, read and write bandwidth over as many
// elements as the rank's logits hold; the binding bound for forward + backward (two exps
// per logit; two reads and one write of the logits) and the fused kernel's % of it, with
// and without LossParallelOptions::gradient_in_forward. --grid runs that roofline for
// every case of V x tokens x dtype x gradient_in_forward at this TP (a reduced grid on
// machines with <= 4 cores, which says so; --full-grid forces all); --json PATH appends one
// JSON line per case. scripts/bench_loss_roofline.sh runs the grid for several TP degrees.
// On a GPU (--device cuda) the roofline is HBM traffic alone (ATen's sum and fill over a
// buffer of the logits' bytes give the read and write bandwidth); the exp is not measured.
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
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include <unistd.h>

#include "bench/memory_probe.h"
#include "hp_bench_linear.h"
#include "hyper_parallel/hyper_parallel.h"
#include "loss/kernel/cross_entropy_cpu_kernel.h"
#include "loss/math/gradient_buffer.h"

namespace hp = hyper_parallel;
namespace F = torch::nn::functional;

namespace {

// --dtype's names.
const std::map<std::string, at::ScalarType> kDtypes = {
    {"float32", at::kFloat}, {"bfloat16", at::kBFloat16}, {"float16", at::kHalf}};

const char* short_name(at::ScalarType t) { return t == at::kBFloat16 ? "bf16" : t == at::kHalf ? "f16" : "f32"; }

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
    // The fused loss keeps its gradient buffer between steps (reused, no page faults):
    // memory it holds, so counted although it was allocated before this step.
    m.peak_mb =
        static_cast<double>(hp::bench::peak_memory_bytes(device) - before + hp::cached_gradient_buffer_bytes()) /
        (1 << 20);
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
  bool scaling = false;
  std::string python = HP_DEFAULT_PYTHON;
  bool grid = false, full_grid = false;
  std::string json;
  int64_t linear_dim = 0;  // > 0: the --linear mode
  int64_t chunk_tokens = 0, vocab_block = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(s + " needs a value");
      return std::string(argv[++i]);
    };
    if (s == "--tokens")
      a.tokens = std::stoll(next());
    else if (s == "--vocab")
      a.vocab = std::stoll(next());
    else if (s == "--iters")
      a.iters = std::stoi(next());
    else if (s == "--threads")
      a.threads = std::stoi(next());
    else if (s == "--dtype")
      a.dtype = next();
    else if (s == "--device")
      a.device = next();
    else if (s == "--vs-pytorch")
      a.vs_pytorch = true;
    else if (s == "--scaling")
      a.scaling = true;
    else if (s == "--python")
      a.python = next();
    else if (s == "--grid")
      a.grid = true;
    else if (s == "--full-grid")
      a.grid = a.full_grid = true;
    else if (s == "--json")
      a.json = next();
    else if (s == "--linear")
      a.linear_dim = std::stoll(next());
    else if (s == "--chunk-tokens")
      a.chunk_tokens = std::stoll(next());
    else if (s == "--vocab-block")
      a.vocab_block = std::stoll(next());
    else
      throw std::invalid_argument(
          "unknown argument '" + s +
          "'; expected --tokens N --vocab V --iters K "
          "--threads T --dtype float32|bfloat16|float16 --device cpu|cuda --vs-pytorch --python PY --scaling "
          "--grid --full-grid --json PATH --linear DIM --chunk-tokens N --vocab-block N");
  }
  if (!kDtypes.count(a.dtype))
    throw std::invalid_argument("--dtype: expected float32, bfloat16 or float16, got " + a.dtype);
  if (a.device != "cpu" && a.device != "cuda")
    throw std::invalid_argument("--device: expected cpu or cuda, got " + a.device);
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
  std::printf(
      "hp-bench: cross-entropy forward+backward, %lld tokens x %lld classes, %s, %s, TP %lld, %d threads per rank\n",
      static_cast<long long>(a.tokens), static_cast<long long>(a.vocab), a.dtype.c_str(), a.device.c_str(),
      static_cast<long long>(tp), at::get_num_threads());
  std::printf("%-11s %10s %10s %10s %11s %10s %10s %12s %12s\n", "method", "ms", "vs single", "vs gather", "peak MiB",
              "vs single", "vs gather", "collectives", "loss");
  for (const auto& m : results) {
    std::printf("%-11s %10.2f %9.2fx %9.2fx %11.1f %9.2fx %9.2fx %12lld %12.6f\n", m.name.c_str(), m.ms,
                m.ms / single.ms, m.ms / gather.ms, m.peak_mb, m.peak_mb / single.peak_mb, m.peak_mb / gather.peak_mb,
                static_cast<long long>(m.collectives), m.loss);
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

// ---- The roofline of the fused kernel, measured here and now ----

struct Limits {
  double exp_per_s = 0;   // the kernel's vectorised exp, all of this rank's threads (0 on a GPU)
  double read_gb_s = 0;   // vectorised sum over a logits-sized buffer
  double write_gb_s = 0;  // fill of a logits-sized, already-touched buffer
};

// Measures the limits for n elements of `dtype` on this rank's threads (or its GPU); once
// per step of the kernel, interleaved with it, so both see the same (shared, noisy) machine.
class LimitProbe {
 public:
  LimitProbe(int64_t n, at::ScalarType dtype, c10::Device device)
      : n_(n),
        device_(device),
        resident_((int64_t{1} << 16) * at::get_num_threads()),
        exp_buf_(at::rand({resident_}, at::kFloat)),
        // The same bytes as the rank's logits, touched now: no page faults when timed.
        big_(at::rand({n * static_cast<int64_t>(c10::elementSize(dtype)) / 4}, at::kFloat).to(device)) {}

  Limits once() {
    Limits l;
    if (device_.is_cuda()) {
      // HBM: ATen's reduction and fill run near the memory's bandwidth.
      const double bytes = static_cast<double>(big_.numel()) * 4;
      double ms = time([&] { sink_ = sink_ + big_.sum().item<double>(); });
      l.read_gb_s = bytes / (ms * 1e-3) / 1e9;
      ms = time([&] {
        big_.fill_(0.5);
        hp::bench::synchronize(device_);
      });
      l.write_gb_s = bytes / (ms * 1e-3) / 1e9;
      return l;
    }
    // exp: a cache-resident slice per thread, passed over until n exps are done.
    const int reps = static_cast<int>(std::max<int64_t>(1, n_ / resident_));
    double ms =
        time([&] { sink_ = sink_ + hp::ce_kernel::exp_throughput_probe(exp_buf_.data_ptr<float>(), resident_, reps); });
    l.exp_per_s = static_cast<double>(resident_) * reps / (ms * 1e-3);
    const double bytes = static_cast<double>(big_.numel()) * 4;
    ms = time([&] { sink_ = sink_ + hp::ce_kernel::read_probe(big_.data_ptr<float>(), big_.numel()); });
    l.read_gb_s = bytes / (ms * 1e-3) / 1e9;
    ms = time([&] { big_.fill_(0.5); });
    l.write_gb_s = bytes / (ms * 1e-3) / 1e9;
    return l;
  }

 private:
  template <typename Fn>
  static double time(Fn&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  int64_t n_;
  c10::Device device_;
  int64_t resident_;
  at::Tensor exp_buf_, big_;
  volatile double sink_ = 0;
};

// The fused kernel that runs on `device`: "CUDA", or the CPU variant chosen at run time.
const char* kernel_name(c10::Device device) { return device.is_cuda() ? "CUDA" : hp::ce_kernel::capability_name(); }

struct RooflineCase {
  int64_t tokens, vocab;
  std::string dtype;
  bool gradient_in_forward;
};

// Fused forward + backward (median), split into forward and backward, plus its bounds.
nlohmann::json roofline_case(const RooflineCase& c, const hp::DeviceMesh& mesh, int iters) {
  const at::ScalarType dtype = kDtypes.at(c.dtype);
  const c10::Device device = mesh.device();
  const int64_t tp = mesh.size();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const hp::ChunkRange mine = hp::chunk_range(c.vocab, tp, mesh.get_rank());
  // This rank's piece only (the full logits need not fit in memory).
  at::Tensor original = (at::randn({c.tokens, mine.length}, gen, at::kFloat) * 2).to(dtype).to(device);
  at::Tensor target = at::randint(c.vocab, {c.tokens}, gen, at::kLong).to(device);
  mesh.comm(0).broadcast_(target, 0);
  at::Tensor work = original.clone();
  hp::FromLocalOptions from_local;
  from_local.shape = std::vector<int64_t>{c.tokens, c.vocab};
  hp::LossParallelOptions options;
  options.gradient_in_forward = c.gradient_in_forward;
  double loss_value = 0;
  int64_t fwd_coll = 0, bwd_coll = 0;
  const int64_t n = c.tokens * mine.length;
  const double bytes = static_cast<double>(n) * original.element_size();
  LimitProbe probe(n, dtype, device);
  std::vector<double> fwds, bwds, totals, exp_rates, reads, writes, exp_bounds, traffic_bounds, percents;
  for (int i = 0; i < iters + 1; ++i) {
    if (c.gradient_in_forward) work.copy_(original);  // the previous step overwrote it
    // Logits a model would give: not a leaf (the gradient is written in forward only over
    // logits that are not the caller's leaf values).
    at::Tensor leaf = work.detach().set_requires_grad(true);
    at::Tensor x = hp::DTensor::from_local(leaf, mesh, {hp::Shard(1)}, from_local);
    hp::bench::synchronize(device);
    mesh.comm(0).barrier();
    hp::reset_collective_counts();
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor loss;
    {
      auto guard = hp::loss_parallel(options);
      loss = F::cross_entropy(x, target);
    }
    hp::bench::synchronize(device);
    const auto t1 = std::chrono::steady_clock::now();
    fwd_coll = hp::collective_counts().total();
    hp::reset_collective_counts();
    loss.backward();
    hp::bench::synchronize(device);
    const auto t2 = std::chrono::steady_clock::now();
    bwd_coll = hp::collective_counts().total();
    loss_value = hp::to_local(loss).item<double>();
    x = loss = at::Tensor();
    mesh.comm(0).barrier();
    const Limits l = probe.once();
    if (i == 0) continue;  // warm-up
    fwds.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    bwds.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    totals.push_back(fwds.back() + bwds.back());
    exp_rates.push_back(l.exp_per_s);
    reads.push_back(l.read_gb_s);
    writes.push_back(l.write_gb_s);
    // One exp per logit forward, one backward (not measured on a GPU: memory binds there).
    exp_bounds.push_back(l.exp_per_s > 0 ? 2.0 * n / l.exp_per_s * 1e3 : 0.0);
    traffic_bounds.push_back((2 * bytes / (l.read_gb_s * 1e9) + bytes / (l.write_gb_s * 1e9)) * 1e3);
    percents.push_back(100.0 * std::max(exp_bounds.back(), traffic_bounds.back()) / totals.back());
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  work = at::Tensor();
  hp::release_gradient_buffers();
  const double exp_bound = med(exp_bounds), traffic_bound = med(traffic_bounds);
  nlohmann::json j;
  j["tokens"] = c.tokens;
  j["vocab"] = c.vocab;
  j["tp"] = tp;
  j["dtype"] = c.dtype;
  j["gradient_in_forward"] = c.gradient_in_forward;
  j["threads_per_rank"] = at::get_num_threads();
  j["kernel"] = kernel_name(device);
  j["logits_per_rank"] = n;
  j["forward_ms"] = med(fwds);
  j["backward_ms"] = med(bwds);
  j["total_ms"] = med(totals);
  j["exp_per_s"] = med(exp_rates);
  j["read_gb_s"] = med(reads);
  j["write_gb_s"] = med(writes);
  j["exp_bound_ms"] = exp_bound;
  j["traffic_bound_ms"] = traffic_bound;
  j["binding"] = exp_bound >= traffic_bound ? "exp" : "traffic";
  // The median over steps of (binding bound measured right after the step) / (the step).
  j["percent_of_bound"] = med(percents);
  j["collectives_forward"] = fwd_coll;
  j["collectives_backward"] = bwd_coll;
  j["loss"] = loss_value;
  return j;
}

void print_roofline_header() {
  std::printf("%-7s %6s %5s %3s %4s %9s %9s %9s %9s %9s %8s %9s %9s %7s %6s\n", "tokens", "vocab", "TP", "gif", "dt",
              "fwd ms", "bwd ms", "total ms", "G exp/s", "rd GB/s", "wr GB/s", "exp bnd", "mem bnd", "% bnd", "coll");
}

void print_roofline_row(const nlohmann::json& j) {
  std::printf("%-7lld %6lld %5lld %3s %4s %9.2f %9.2f %9.2f %9.2f %9.2f %8.2f %9.2f %9.2f %6.0f%% %3lld/%lld\n",
              j["tokens"].get<long long>(), j["vocab"].get<long long>(), j["tp"].get<long long>(),
              j["gradient_in_forward"].get<bool>() ? "yes" : "no",
              short_name(kDtypes.at(j["dtype"].get<std::string>())), j["forward_ms"].get<double>(),
              j["backward_ms"].get<double>(), j["total_ms"].get<double>(), j["exp_per_s"].get<double>() / 1e9,
              j["read_gb_s"].get<double>(), j["write_gb_s"].get<double>(), j["exp_bound_ms"].get<double>(),
              j["traffic_bound_ms"].get<double>(), j["percent_of_bound"].get<double>(),
              j["collectives_forward"].get<long long>(), j["collectives_backward"].get<long long>());
}

int run_roofline(const Args& a, const hp::DeviceMesh& mesh, const std::vector<RooflineCase>& cases,
                 const std::string& note) {
  const bool leader = mesh.get_rank() == 0;
  if (leader) {
    std::printf(
        "hp-bench roofline: fused cross-entropy forward+backward per rank vs limits measured in this run "
        "(%s kernel, %d threads per rank, TP %lld)\n%s",
        kernel_name(mesh.device()), at::get_num_threads(), static_cast<long long>(mesh.size()), note.c_str());
    print_roofline_header();
  }
  for (const auto& c : cases) {
    nlohmann::json j = roofline_case(c, mesh, a.iters);
    if (!leader) continue;
    print_roofline_row(j);
    std::fflush(stdout);
    if (!a.json.empty()) {
      std::ofstream out(a.json, std::ios::app);
      out << j.dump() << "\n";
    }
  }
  if (leader) {
    std::printf(
        "(exp bnd: 2 exps per logit at the measured rate; mem bnd: 2 reads + 1 write of the logits at the "
        "measured bandwidths; %% bnd: median over steps of max(bounds measured right after the step) / "
        "the step; medians of %d steps; coll = collectives forward/backward%s)\n",
        a.iters, mesh.device().is_cuda() ? "; on a GPU the exp is not measured: the memory bound alone" : "");
  }
  return 0;
}

// ---- Scaling: the same shape at 1, 2, 4 ... threads per rank, ours and PyTorch's ----

// 1, 2, 4 ... up to --threads, or else to the cores each rank of this node has (at least 2).
std::vector<int> scaling_threads(const Args& a) {
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const int ranks_here = std::max(1, local ? std::atoi(local) : 1);
  const int most =
      a.threads > 0 ? a.threads : std::max(2, static_cast<int>(std::thread::hardware_concurrency()) / ranks_here);
  std::vector<int> counts;
  for (int t = 1; t <= most; t *= 2) counts.push_back(t);
  if (counts.back() != most) counts.push_back(most);
  return counts;
}

int run_scaling(const Args& a, const hp::DeviceMesh& mesh, const std::function<double()>& single,
                const std::function<double()>& fused) {
  const std::vector<int> counts = scaling_threads(a);
  std::vector<Measure> ours_single, ours_fused;
  for (int t : counts) {
    at::set_num_threads(t);
    mesh.comm(0).barrier();
    ours_single.push_back(run("single", a.iters, mesh.device(), single));
    ours_fused.push_back(run("fused", a.iters, mesh.device(), fused));
  }
  mesh.comm(0).barrier();
  if (mesh.get_rank() != 0) return 0;
  // PyTorch's side after all of ours, one torchrun per thread count (the other ranks have exited).
  std::vector<std::map<std::string, Measure>> theirs;
  for (int t : counts) {
    Args at_t = a;
    at_t.threads = t;
    const std::string json_path = "/tmp/hp-bench-pytorch-" + std::to_string(::getpid()) + ".jsonl";
    theirs.push_back(run_pytorch(at_t, mesh.size(), json_path));
    std::remove(json_path.c_str());
    std::remove((json_path + ".log").c_str());
  }
  std::printf(
      "hp-bench scaling: cross-entropy forward+backward, %lld tokens x %lld classes, %s, %s, TP %lld, %s kernel; "
      "median ms per rank by threads per rank\n",
      static_cast<long long>(a.tokens), static_cast<long long>(a.vocab), a.dtype.c_str(), a.device.c_str(),
      static_cast<long long>(mesh.size()), kernel_name(mesh.device()));
  std::printf("%7s %10s %7s %10s %7s %12s %7s %12s %7s %10s %10s\n", "threads", "fused ms", "x 1t", "single ms", "x 1t",
              "torch lp ms", "x 1t", "torch 1p ms", "x 1t", "fused/lp", "single/1p");
  auto ms_of = [](const std::map<std::string, Measure>& m, const char* name) {
    auto it = m.find(name);
    return it == m.end() ? std::nan("") : it->second.ms;
  };
  for (size_t i = 0; i < counts.size(); ++i) {
    const double lp = ms_of(theirs[i], "loss_parallel"), lp1 = ms_of(theirs[0], "loss_parallel");
    const double one = ms_of(theirs[i], "single"), one1 = ms_of(theirs[0], "single");
    std::printf("%7d %10.2f %6.2fx %10.2f %6.2fx %12.2f %6.2fx %12.2f %6.2fx %9.3fx %9.3fx\n", counts[i],
                ours_fused[i].ms, ours_fused[i].ms / ours_fused[0].ms, ours_single[i].ms,
                ours_single[i].ms / ours_single[0].ms, lp, lp / lp1, one, one / one1, ours_fused[i].ms / lp,
                ours_single[i].ms / one);
    if (std::abs(ours_fused[i].loss - ours_fused[0].loss) > 1e-4 * std::max(1.0, std::abs(ours_fused[0].loss)))
      std::printf("  WARNING: the fused loss at %d threads (%.6f) differs from 1 thread's (%.6f)\n", counts[i],
                  ours_fused[i].loss, ours_fused[0].loss);
  }
  std::printf(
      "(fused: ours, loss_parallel's fused kernel; single: ATen's cross_entropy on the full logits in this "
      "process; torch lp / 1p: PyTorch %s's loss_parallel / single-process cross_entropy, same shapes, seeds and "
      "threads; x 1t: time / its time at 1 thread; nan: the PyTorch side failed)\n",
      TORCH_VERSION);
  return 0;
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
  const at::ScalarType dtype = kDtypes.at(a.dtype);
  hp_memory_probe_install();
  hp::InitOptions init;
  init.device_type = a.device;
  hp::init_process_group(init);
  auto mesh = hp::init_device_mesh(a.device, {hp::get_world_size()}, {"tp"});
  const c10::Device device = mesh.device();
  const int64_t rank = mesh.get_rank();
  if (a.linear_dim > 0) {
    hp_bench::LinearArgs la;
    la.tokens = a.tokens;
    la.vocab = a.vocab;
    la.dim = a.linear_dim;
    la.iters = a.iters;
    la.dtype = dtype;
    la.chunk_tokens = a.chunk_tokens;
    la.vocab_block = a.vocab_block;
    return hp_bench::run_linear_bench(la, mesh);
  }
  if (a.grid) {
    std::vector<int64_t> vocabs{32000, 128256}, tokens{4096, 16384};
    std::string note;
    if (!a.full_grid && a.device == "cpu" && std::thread::hardware_concurrency() <= 4) {
      vocabs = {32000};
      tokens = {4096};
      note = "(reduced grid: this machine has " + std::to_string(std::thread::hardware_concurrency()) +
             " cores; --full-grid adds vocab 128256 and 16384 tokens)\n";
    }
    std::vector<RooflineCase> cases;
    for (int64_t v : vocabs)
      for (int64_t t : tokens)
        for (const char* dt : {"float32", "bfloat16", "float16"})
          for (bool gif : {false, true}) cases.push_back({t, v, dt, gif});
    return run_roofline(a, mesh, cases, note);
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor full = (at::randn({a.tokens, a.vocab}, gen, at::kFloat) * 2).to(dtype).to(device);
  at::Tensor target = at::randint(a.vocab, {a.tokens}, gen, at::kLong).to(device);
  at::Tensor sharded = hp::distribute_tensor(full, mesh, {hp::Shard(1)});
  auto leaf = [](const at::Tensor& t) { return t.detach().set_requires_grad(true); };
  const std::function<double()> single = [&] {
    at::Tensor x = leaf(full);
    at::Tensor loss = F::cross_entropy(x, target);
    loss.backward();
    return loss.item<double>();
  };
  const std::function<double()> fused = [&] {
    at::Tensor x = leaf(sharded);
    auto guard = hp::loss_parallel();
    at::Tensor loss = F::cross_entropy(x, target);
    loss.backward();
    return hp::full_tensor(loss).item<double>();
  };
  if (a.scaling) return run_scaling(a, mesh, single, fused);
  std::vector<Measure> results;
  results.push_back(run("single", a.iters, device, single));
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
  results.push_back(run("fused", a.iters, device, fused));
  mesh.comm(0).barrier();
  // The roofline of this case's fused kernel, same run.
  full = sharded = at::Tensor();
  std::vector<RooflineCase> cases{{a.tokens, a.vocab, a.dtype, false}, {a.tokens, a.vocab, a.dtype, true}};
  if (rank == 0) {
    print_ours(results, a, mesh.size());
    std::printf("\n");
  }
  run_roofline(a, mesh, cases, "");
  mesh.comm(0).barrier();
  if (rank != 0) return 0;
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
