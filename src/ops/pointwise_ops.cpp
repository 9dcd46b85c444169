#include "ops/pointwise_ops.h"

#include "hyper_parallel/dispatch/sharding_strategy.h"

#include <ATen/ExpandUtils.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>

namespace hyper_parallel {

namespace {

// Output dim that input dim `d` of an `in_ndim`-D input lands on under broadcasting,
// or -1 when that input dim is broadcast (size 1 against a larger output).
int64_t output_dim(const TensorArg& in, int64_t d, const std::vector<int64_t>& out) {
  const int64_t od = d + static_cast<int64_t>(out.size()) - static_cast<int64_t>(in.shape.size());
  if (od < 0 || in.shape[d] != out[od]) return -1;
  return od;
}

int64_t input_dim(const TensorArg& in, int64_t od, const std::vector<int64_t>& out) {
  const int64_t d = od - static_cast<int64_t>(out.size()) + static_cast<int64_t>(in.shape.size());
  if (d < 0 || in.shape[d] != out[od]) return -1;
  return d;
}

}  // namespace

PointwiseOp::Linearity PointwiseOp::parse_linearity(const std::string& s) {
  if (s.empty() || s == "none") return Linearity::None;
  if (s == "unary") return Linearity::Unary;
  if (s == "additive") return Linearity::Additive;
  if (s == "multiplicative") return Linearity::Multiplicative;
  if (s == "quotient") return Linearity::Quotient;
  TORCH_CHECK(false, "PointwiseOp: linearity '", s, "' is not one of none, unary, additive, multiplicative, quotient");
}

std::string PointwiseOp::rule() const {
  const char* lin = linearity_ == Linearity::None       ? "Partial inputs are reduced first"
                    : linearity_ == Linearity::Unary    ? "Partial(sum) passes through"
                    : linearity_ == Linearity::Additive ? "Partial(sum) + Partial(sum) or Replicate -> Partial(sum)"
                    : linearity_ == Linearity::Quotient ? "Partial(sum) / Replicate -> Partial(sum)"
                                                        : "Partial(sum) * Replicate -> Partial(sum)";
  return std::string(
             "per mesh dim the cheapest of: sharded where an input's Shard lands (ties: the earlier "
             "input), Partial(sum) when linear, Replicate; in place keeps self's placements; broadcast "
             "dims replicated; ") +
         lin;
}

ShardingDecision PointwiseOp::infer_layout(const OpCall& call) const {
  // The output shape is the operands' broadcast, computed here: a meta run
  // (infer_output_shapes) would cost a boxed call on every pointwise op.
  std::vector<int64_t> out;
  for (const auto& t : call.tensors()) {
    out = at::infer_size(out, t.shape);
  }
  const DeviceMesh& mesh = call.mesh();
  const auto& tensors = call.tensors();
  const int64_t nm = mesh.ndim();

  bool has_scalar_addend = false;
  for (const auto& a : call.schema().arguments()) {
    has_scalar_addend |= a.name() == "other" && a.type()->kind() == c10::TypeKind::NumberType;
  }
  // Whether Partial(sum) operands on mesh dim m may stay unreduced.
  auto partial_passes = [&](int64_t m) {
    std::vector<size_t> partial;
    for (size_t k = 0; k < tensors.size(); ++k) {
      const TensorArg& t = tensors[k];
      if (t.layout && t.layout->placement(m) == Placement::partial(ReduceOp::Sum)) partial.push_back(k);
    }
    if (partial.empty()) return false;
    switch (linearity_) {
      case Linearity::None:
        return false;
      case Linearity::Unary:
        return tensors.size() == 1;
      // Replicate addends become Partial (kept on one rank, zeros elsewhere: no
      // communication); a non-tensor Scalar addend would be added on every rank.
      case Linearity::Additive:
        return !has_scalar_addend;
      case Linearity::Multiplicative:
        return partial.size() == 1;  // any single factor
      case Linearity::Quotient:
        return partial.size() == 1 && partial[0] == 0;  // the numerator
    }
    return false;
  };

  // What operand `t` must be on mesh dim m for the output placement `o`.
  auto operand_placement = [&](const TensorArg& t, const Placement& o, int64_t m, const std::vector<int64_t>& shape) {
    if (o.is_shard()) {
      const int64_t id = input_dim(t, o.dim(), shape);
      return id >= 0 ? Placement::shard(id) : Placement::replicate();  // broadcast: replicated
    }
    if (o.is_partial()) {
      if (t.layout && t.layout->placement(m).is_partial()) return t.layout->placement(m);
      if (linearity_ == Linearity::Additive) return Placement::partial(ReduceOp::Sum);
    }
    return Placement::replicate();
  };

  Placements target(nm, Placement::replicate());
  if (call.is_inplace()) {
    TORCH_CHECK(tensors.at(0).layout, call.name(),
                ": in-place op on a plain tensor with DTensor "
                "arguments; expected self to be a DTensor");
    target = tensors[0].layout->placements();
    // A Partial self the op is not linear in is computed on its Replicate value; the
    // dispatcher writes the result back into self's Partial layout.
    for (int64_t m = 0; m < nm; ++m) {
      if (target[m].is_partial() && !partial_passes(m)) target[m] = Placement::replicate();
    }
  } else {
    // Per mesh dim, the candidates are: the output sharded where an operand's shard lands
    // (in argument order), Partial(sum) if the op is linear in the partial operands, and
    // Replicate; the shared cost model keeps the one that moves the fewest bytes. Every
    // tensor argument is an operand (0-d plain tensors too: an addend must become Partial
    // when the result is).
    std::vector<size_t> operands(tensors.size());
    std::iota(operands.begin(), operands.end(), size_t{0});
    for (int64_t m = 0; m < nm; ++m) {
      std::vector<Placement> outputs;
      for (const TensorArg& t : tensors) {
        if (!t.layout || !t.layout->placement(m).is_shard()) continue;
        const int64_t od = output_dim(t, t.layout->placement(m).dim(), out);
        if (od < 0) continue;
        // The same output dim may not be sharded twice (nesting is an input's business).
        bool taken = false;
        for (int64_t j = 0; j < m; ++j) taken |= target[j].is_shard(od);
        const Placement p = Placement::shard(od);
        if (!taken && std::find(outputs.begin(), outputs.end(), p) == outputs.end()) outputs.push_back(p);
      }
      if (partial_passes(m)) outputs.push_back(Placement::partial(ReduceOp::Sum));
      outputs.push_back(Placement::replicate());
      std::vector<DimStrategy> candidates;
      for (const Placement& o : outputs) {
        DimStrategy s{{}, o};
        for (const TensorArg& t : tensors) s.inputs.push_back(operand_placement(t, o, m, out));
        candidates.push_back(std::move(s));
      }
      target[m] = outputs[cheapest_strategy(call, m, operands, candidates)];
    }
  }

  ShardingDecision d;
  for (const TensorArg& t : tensors) {
    Placements want(nm, Placement::replicate());
    for (int64_t m = 0; m < nm; ++m) want[m] = operand_placement(t, target[m], m, out);
    if (!t.layout && (t.shape.empty() && linearity_ != Linearity::Additive)) {
      d.input_placements.emplace_back(std::nullopt);  // a scalar: as it is
    } else if (!t.layout && want == Placements(nm, Placement::replicate())) {
      d.input_placements.emplace_back(std::nullopt);  // plain and replicated: as it is
    } else {
      d.input_placements.emplace_back(want);
    }
  }
  if (call.is_inplace()) {
    TORCH_CHECK(!d.input_placements[0] || *d.input_placements[0] == target, call.name(),
                ": cannot run in place on a DTensor with ", to_string(target),
                " given the other inputs; expected layouts that keep self's placements");
  }
  TORCH_CHECK(call.schema().returns().size() == 1, call.name(), ": PointwiseOp expects one output; the op has ",
              call.schema().returns().size());
  d.output_layouts.push_back({Layout(mesh, target, out)});
  return d;
}

HP_REGISTER_OP_CLASS(PointwiseOp, [](const OpParams& p) {
  return std::make_shared<PointwiseOp>(PointwiseOp::parse_linearity(p.get("linearity", "none")));
});

}  // namespace hyper_parallel
