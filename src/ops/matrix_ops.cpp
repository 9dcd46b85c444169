#include "ops/matrix_ops.h"

#include <c10/util/Exception.h>

#include <limits>

namespace hyper_parallel {

namespace {

struct Strategy {
  Placement a, b, out;
};

// Rough bytes moved to bring an operand from `cur` to `want` (elements, really).
double move_cost(const Placement& cur, const Placement& want, double numel) {
  if (cur == want) return 0;
  if (cur.is_replicate()) return 0.01 * numel;  // a local chunk or zeroing
  if (cur.is_partial() && want.is_replicate()) return 2 * numel;
  return numel;  // all-gather, reduce-scatter, shard -> shard
}

double numel_of(const std::vector<int64_t>& shape) {
  double n = 1;
  for (int64_t s : shape) n *= static_cast<double>(s);
  return n;
}

Placement current(const TensorArg& t, int64_t m) {
  return t.layout ? t.layout->placement(m) : Placement::replicate();
}

// Placement of addmm's bias (broadcast against [m, n]) for an output placement.
Placement bias_placement(const TensorArg& bias, const Placement& out, int64_t out_ndim) {
  if (out.is_partial()) return Placement::partial(ReduceOp::Sum);
  if (!out.is_shard()) return Placement::replicate();
  const int64_t nb = bias.shape.size();
  const int64_t bd = out.dim() - (out_ndim - nb);
  if (bd >= 0 && bias.shape[bd] != 1) return Placement::shard(bd);
  return Placement::replicate();
}

}  // namespace

std::string MatmulOp::rule() const {
  return "per mesh dim the cheapest of (S(m),R)->S(m), (R,S(n))->S(n), (S(k),S(k))->P, "
         "(P,R)/(R,P)->P, (R,R)->R [bmm: (S(b),S(b))->S(b)]; addmm bias follows the output";
}

ShardingDecision MatmulOp::infer_layout(const OpCall& call) const {
  const bool has_bias = call.name() == "addmm";
  const auto& tensors = call.tensors();
  TORCH_CHECK(tensors.size() == (has_bias ? 3u : 2u), call.name(), ": expected ",
              has_bias ? 3 : 2, " tensor arguments");
  const TensorArg& a = tensors[has_bias ? 1 : 0];
  const TensorArg& b = tensors[has_bias ? 2 : 1];
  const bool batched = call.name() == "bmm";
  const int64_t o = batched ? 1 : 0;
  const int64_t out_ndim = 2 + o;
  std::vector<Strategy> strategies = {
      {Placement::shard(o), Placement::replicate(), Placement::shard(o)},          // rows
      {Placement::replicate(), Placement::shard(o + 1), Placement::shard(o + 1)},  // columns
      {Placement::shard(o + 1), Placement::shard(o), Placement::partial()},        // contraction
      {Placement::partial(), Placement::replicate(), Placement::partial()},
      {Placement::replicate(), Placement::partial(), Placement::partial()},
      {Placement::replicate(), Placement::replicate(), Placement::replicate()},
  };
  if (batched) strategies.insert(strategies.begin(), {Placement::shard(0), Placement::shard(0), Placement::shard(0)});

  const int64_t nm = call.mesh().ndim();
  const double na = numel_of(a.shape), nb = numel_of(b.shape);
  Placements want_a(nm, Placement::replicate()), want_b = want_a, out = want_a;
  for (int64_t m = 0; m < nm; ++m) {
    const Placement ca = current(a, m), cb = current(b, m);
    double best = std::numeric_limits<double>::infinity();
    for (const auto& s : strategies) {
      const double c = move_cost(ca, s.a, na) + move_cost(cb, s.b, nb);
      if (c < best) {
        best = c;
        want_a[m] = s.a;
        want_b[m] = s.b;
        out[m] = s.out;
      }
    }
  }
  ShardingDecision d;
  d.input_placements.assign(tensors.size(), std::nullopt);
  d.input_placements[has_bias ? 1 : 0] = want_a;
  d.input_placements[has_bias ? 2 : 1] = want_b;
  if (has_bias) {
    Placements want_bias(nm, Placement::replicate());
    for (int64_t m = 0; m < nm; ++m) want_bias[m] = bias_placement(tensors[0], out[m], out_ndim);
    d.input_placements[0] = want_bias;
  }
  const auto shapes = infer_output_shapes(call);
  d.output_layouts.push_back({Layout(call.mesh(), out, shapes.at(0).at(0))});
  return d;
}

HP_REGISTER_OP_CLASS(MatmulOp, [](const OpParams&) { return std::make_shared<MatmulOp>(); });

}  // namespace hyper_parallel
