// The start of the per-rank memory benchmarks over a Llama (hp-bench-sp, hp-bench-ac): their
// command line (--dim --layers --heads --vocab --batch --seq --iters --threads, whole
// numbers, and --device cpu|cuda), their TP mesh over every rank of hp-run, and the largest
// of a figure over the ranks, which they report.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <map>
#include <stdexcept>
#include <string>

#include "bench/memory_probe.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/models/llama.h"

namespace hyper_parallel::bench {

struct LlamaBenchArgs {
  std::map<std::string, int64_t> n = {{"dim", 256}, {"layers", 4}, {"heads", 8}, {"vocab", 8192},
                                      {"batch", 2}, {"seq", 512},  {"iters", 2}, {"threads", 1}};
  std::string device = "cpu";

  // The model the sizes describe.
  LlamaArgs llama() const {
    LlamaArgs la;
    la.dim = n.at("dim");
    la.n_layers = n.at("layers");
    la.n_heads = n.at("heads");
    la.vocab_size = n.at("vocab");
    la.max_seq_len = n.at("seq");
    return la;
  }
};

// `defaults` with the flags given; a bad flag is a std::invalid_argument naming it.
inline LlamaBenchArgs parse_llama_bench_args(int argc, char** argv, LlamaBenchArgs a) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag.rfind("--", 0) != 0 || i + 1 >= argc) throw std::invalid_argument("expected --NAME VALUE, got " + flag);
    const std::string name = flag.substr(2), value = argv[++i];
    if (name == "device") {
      if (value != "cpu" && value != "cuda")
        throw std::invalid_argument("--device: expected cpu or cuda, got " + value);
      a.device = value;
    } else if (a.n.count(name)) {
      a.n[name] = std::stoll(value);
      if (a.n[name] < (name == "threads" ? 0 : 1)) throw std::invalid_argument(flag + " must be positive");
    } else {
      throw std::invalid_argument("unknown flag " + flag +
                                  "; expected --dim --layers --heads --vocab --batch --seq --iters --threads --device");
    }
  }
  return a;
}

// A benchmark started by hp-run: `defaults` with the flags given, the intra-op threads set,
// the memory probe installed (CPU) and a 1-D "tp" mesh over every rank. nullopt, after
// saying why on stderr, for a bad flag or a start outside hp-run (the program exits 2).
struct LlamaBench {
  LlamaBenchArgs args;
  DeviceMesh mesh;
};
inline std::optional<LlamaBench> start_llama_bench(const std::string& program, int argc, char** argv,
                                                   const LlamaBenchArgs& defaults) {
  LlamaBenchArgs a;
  try {
    a = parse_llama_bench_args(argc, argv, defaults);
  } catch (const std::exception& e) {
    std::cerr << program << ": " << e.what() << std::endl;
    return std::nullopt;
  }
  if (!std::getenv("WORLD_SIZE")) {
    std::cerr << program << ": run it through hp-run (e.g. hp-run --nproc-per-node 2 " << program << ")" << std::endl;
    return std::nullopt;
  }
  if (a.n.at("threads") > 0) at::set_num_threads(static_cast<int>(a.n.at("threads")));
  if (a.device == "cpu") hp_memory_probe_install();
  InitOptions init;
  init.device_type = a.device;
  init_process_group(init);
  DeviceMesh mesh = init_device_mesh(a.device, {get_world_size()}, {"tp"});
  return LlamaBench{std::move(a), std::move(mesh)};
}

// The largest `v` over the ranks of `mesh` (its first dim).
inline double max_over_ranks(const DeviceMesh& mesh, double v) {
  at::Tensor t = at::scalar_tensor(v, at::kDouble).to(mesh.device());
  mesh.comm(0).all_reduce_(t, ReduceOp::Max);
  return t.item<double>();
}

}  // namespace hyper_parallel::bench
