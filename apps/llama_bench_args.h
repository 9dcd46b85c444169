// The command line of the per-rank memory benchmarks over a Llama (hp-bench-sp, hp-bench-ac):
// --dim --layers --heads --vocab --batch --seq --iters --threads (whole numbers) and
// --device cpu|cuda; and the largest of a figure over the ranks, which they report.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/llama.h"

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

// The largest `v` over the ranks of `mesh` (its first dim).
inline double max_over_ranks(const DeviceMesh& mesh, double v) {
  at::Tensor t = at::scalar_tensor(v, at::kDouble).to(mesh.device());
  mesh.comm(0).all_reduce_(t, ReduceOp::Max);
  return t.item<double>();
}

}  // namespace hyper_parallel::bench
