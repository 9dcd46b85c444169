// The conformance suite: every op with a layout rule, called on DTensors in every listed
// placement combination — 1-D meshes of 2 and 3 ranks (even and uneven pieces) and a
// 2 x 2 mesh — in its functional, in-place and out= forms, must give what one process
// computes on the full tensors (value, and gradients where differentiable), or refuse
// with an error on every rank. Nothing else passes.
//
// The cases are generated: each op contributes how to call it (a few lines in the table
// below); the placements, variants and meshes are enumerated here. A test fails when an
// op in the registry has neither a table entry nor a stated reason to be tested elsewhere,
// so a new rule cannot go untested. The totals are printed and recorded in docs/ops.md.
#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

using namespace hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;

namespace {

using Inputs = std::vector<at::Tensor>;
using Fn = std::function<at::Tensor(const Inputs&)>;
using InplaceFn = std::function<void(const Inputs&)>;          // writes into inputs[0]
using OutFn = std::function<void(at::Tensor& out, const Inputs&)>;

struct OpCase {
  std::string op;                                // registry name it exercises
  std::string label;                             // distinguishes several cases of one op
  std::function<Inputs(uint64_t seed)> make;     // full inputs, identical on every rank
  Fn fn;
  InplaceFn inplace;                             // optional
  OutFn out;                                     // optional
  bool grad = true;                              // compare input gradients too
  size_t placed = 0;                             // inputs to distribute (0: all)
};

Inputs reals(uint64_t seed, std::vector<std::vector<int64_t>> shapes) {
  Inputs v;
  for (size_t i = 0; i < shapes.size(); ++i) v.push_back(random_tensor(shapes[i], seed + i));
  return v;
}
Inputs positives(uint64_t seed, std::vector<std::vector<int64_t>> shapes) {
  Inputs v = reals(seed, std::move(shapes));
  for (auto& t : v) t = t.abs() + 0.5;
  return v;
}
const std::vector<int64_t> kShape = {6, 5};  // 6 splits evenly over 2 and 3 ranks, 5 does not

#define HP_UNARY(NAME, MAKE)                                                                \
  OpCase {                                                                                  \
    #NAME, "", [](uint64_t s) { return MAKE(s, {kShape}); },                                \
        [](const Inputs& v) { return at::NAME(v[0]); },                                     \
        [](const Inputs& v) { (void)at::NAME##_(const_cast<at::Tensor&>(v[0])); },         \
        [](at::Tensor& o, const Inputs& v) { (void)at::NAME##_out(o, v[0]); }               \
  }
#define HP_BINARY(NAME, MAKE, GRAD)                                                          \
  OpCase {                                                                                   \
    #NAME, "", [](uint64_t s) { return MAKE(s, {kShape, kShape}); },                         \
        [](const Inputs& v) { return at::NAME(v[0], v[1]); },                                \
        [](const Inputs& v) { (void)v[0].NAME##_(v[1]); },                                   \
        [](at::Tensor& o, const Inputs& v) { (void)at::NAME##_out(o, v[0], v[1]); }, GRAD    \
  }

std::vector<OpCase> op_cases() {
  std::vector<OpCase> c = {
      HP_UNARY(abs, reals), HP_UNARY(cos, reals), HP_UNARY(exp, reals), HP_UNARY(log, positives),
      HP_UNARY(neg, reals), HP_UNARY(reciprocal, positives), HP_UNARY(rsqrt, positives),
      HP_UNARY(sigmoid, reals), HP_UNARY(sin, reals), HP_UNARY(sqrt, positives),
      HP_UNARY(tanh, reals), HP_UNARY(silu, reals), HP_UNARY(square, reals),
      HP_BINARY(add, reals, true), HP_BINARY(sub, reals, true), HP_BINARY(mul, reals, true),
      HP_BINARY(div, positives, true), HP_BINARY(pow, positives, true),
      HP_BINARY(eq, reals, false), HP_BINARY(ne, reals, false), HP_BINARY(lt, reals, false),
      HP_BINARY(le, reals, false), HP_BINARY(gt, reals, false), HP_BINARY(ge, reals, false),
  };
  auto add = [&](OpCase x) { c.push_back(std::move(x)); };
  add({"maximum", "", [](uint64_t s) { return reals(s, {kShape, kShape}); },
       [](const Inputs& v) { return at::maximum(v[0], v[1]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::maximum_out(o, v[0], v[1]); }});
  add({"minimum", "", [](uint64_t s) { return reals(s, {kShape, kShape}); },
       [](const Inputs& v) { return at::minimum(v[0], v[1]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::minimum_out(o, v[0], v[1]); }});
  add({"relu", "", [](uint64_t s) { return reals(s, {kShape}); }, [](const Inputs& v) { return at::relu(v[0]); },
       [](const Inputs& v) { (void)at::relu_(const_cast<at::Tensor&>(v[0])); }, nullptr});
  add({"gelu", "", [](uint64_t s) { return reals(s, {kShape}); }, [](const Inputs& v) { return at::gelu(v[0]); },
       nullptr, [](at::Tensor& o, const Inputs& v) { (void)at::gelu_out(o, v[0]); }});
  add({"logical_not", "", [](uint64_t s) { return Inputs{reals(s, {kShape})[0] > 0}; },
       [](const Inputs& v) { return at::logical_not(v[0]); },
       [](const Inputs& v) { (void)v[0].logical_not_(); },
       [](at::Tensor& o, const Inputs& v) { (void)at::logical_not_out(o, v[0]); }, false});
  add({"bitwise_not", "", [](uint64_t s) { return Inputs{(reals(s, {kShape})[0] * 10).to(at::kLong)}; },
       [](const Inputs& v) { return at::bitwise_not(v[0]); }, [](const Inputs& v) { (void)v[0].bitwise_not_(); },
       [](at::Tensor& o, const Inputs& v) { (void)at::bitwise_not_out(o, v[0]); }, false});
  add({"add", "alpha + broadcast row", [](uint64_t s) { return reals(s, {kShape, {1, 5}}); },
       [](const Inputs& v) { return at::add(v[0], v[1], 0.5); }, [](const Inputs& v) { (void)v[0].add_(v[1], 0.5); },
       [](at::Tensor& o, const Inputs& v) { (void)at::add_out(o, v[0], v[1], 0.5); }});
  add({"mul", "scalar", [](uint64_t s) { return reals(s, {kShape}); }, [](const Inputs& v) { return v[0] * 3.0; },
       [](const Inputs& v) { (void)v[0].mul_(3.0); }, nullptr});
  add({"clamp", "", [](uint64_t s) { return reals(s, {kShape}); },
       [](const Inputs& v) { return at::clamp(v[0], -0.5, 0.5); },
       [](const Inputs& v) { (void)v[0].clamp_(-0.5, 0.5); },
       [](at::Tensor& o, const Inputs& v) { (void)at::clamp_out(o, v[0], -0.5, 0.5); }});
  add({"lerp", "", [](uint64_t s) { return reals(s, {kShape, kShape, kShape}); },
       [](const Inputs& v) { return at::lerp(v[0], v[1], v[2]); }, [](const Inputs& v) { (void)v[0].lerp_(v[1], v[2]); },
       [](at::Tensor& o, const Inputs& v) { (void)at::lerp_out(o, v[0], v[1], v[2]); }});
  add({"addcmul", "", [](uint64_t s) { return reals(s, {kShape, kShape, kShape}); },
       [](const Inputs& v) { return at::addcmul(v[0], v[1], v[2], 0.5); },
       [](const Inputs& v) { (void)v[0].addcmul_(v[1], v[2], 0.5); },
       [](at::Tensor& o, const Inputs& v) { (void)at::addcmul_out(o, v[0], v[1], v[2], 0.5); }});
  add({"addcdiv", "", [](uint64_t s) { return positives(s, {kShape, kShape, kShape}); },
       [](const Inputs& v) { return at::addcdiv(v[0], v[1], v[2], 0.5); },
       [](const Inputs& v) { (void)v[0].addcdiv_(v[1], v[2], 0.5); },
       [](at::Tensor& o, const Inputs& v) { (void)at::addcdiv_out(o, v[0], v[1], v[2], 0.5); }});
  add({"where", "", [](uint64_t s) { auto v = reals(s, {kShape, kShape, kShape}); v[0] = v[0] > 0; return v; },
       [](const Inputs& v) { return at::where(v[0], v[1], v[2]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::where_out(o, v[0], v[1], v[2]); }, false});
  add({"masked_fill", "", [](uint64_t s) { auto v = reals(s, {kShape, kShape}); v[1] = v[1] > 0; return v; },
       [](const Inputs& v) { return at::masked_fill(v[0], v[1], -1.0); },
       [](const Inputs& v) { (void)v[0].masked_fill_(v[1], -1.0); }, nullptr});
  // Matmuls (their gradients also run mm/t/sum in every layout).
  add({"mm", "", [](uint64_t s) { return reals(s, {{6, 5}, {5, 4}}); },
       [](const Inputs& v) { return at::mm(v[0], v[1]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::mm_out(o, v[0], v[1]); }});
  add({"addmm", "", [](uint64_t s) { return reals(s, {{4}, {6, 5}, {5, 4}}); },
       [](const Inputs& v) { return at::addmm(v[0], v[1], v[2]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::addmm_out(o, v[0], v[1], v[2]); }});
  add({"bmm", "", [](uint64_t s) { return reals(s, {{3, 6, 5}, {3, 5, 4}}); },
       [](const Inputs& v) { return at::bmm(v[0], v[1]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::bmm_out(o, v[0], v[1]); }});
  // Reductions.
  auto reduction = [&](const char* op, const char* label, Fn fn, bool grad = true) {
    add({op, label, [](uint64_t s) { return reals(s, {kShape}); }, std::move(fn), nullptr, nullptr, grad});
  };
  reduction("sum", "all", [](const Inputs& v) { return v[0].sum(); });
  reduction("sum", "dim 0", [](const Inputs& v) { return v[0].sum(0); });
  reduction("sum", "dim 1 keepdim", [](const Inputs& v) { return v[0].sum(1, true); });
  reduction("mean", "all", [](const Inputs& v) { return v[0].mean(); });
  reduction("mean", "dim 1", [](const Inputs& v) { return v[0].mean(1); });
  reduction("amax", "dim 1", [](const Inputs& v) { return v[0].amax(1); });
  reduction("amin", "dim 0", [](const Inputs& v) { return v[0].amin(0); });
  reduction("argmax", "dim 1", [](const Inputs& v) { return v[0].argmax(1); }, false);
  reduction("argmin", "dim 0", [](const Inputs& v) { return v[0].argmin(0); }, false);
  reduction("max", "dim 1", [](const Inputs& v) { return std::get<0>(v[0].max(1)); });
  reduction("min", "dim 0", [](const Inputs& v) { return std::get<0>(v[0].min(0)); });
  reduction("prod", "dim 1", [](const Inputs& v) { return v[0].prod(1); });
  reduction("logsumexp", "dim 1", [](const Inputs& v) { return v[0].logsumexp(1); });
  reduction("_softmax", "dim 1", [](const Inputs& v) { return at::softmax(v[0], 1); });
  reduction("_softmax", "dim 0", [](const Inputs& v) { return at::softmax(v[0], 0); });
  reduction("_log_softmax", "dim 1", [](const Inputs& v) { return at::log_softmax(v[0], 1); });
  // Views and shape ops.
  auto view = [&](const char* op, const char* label, Fn fn, InplaceFn inplace = nullptr) {
    add({op, label, [](uint64_t s) { return reals(s, {kShape}); }, std::move(fn), std::move(inplace), nullptr});
  };
  view("view", "flatten", [](const Inputs& v) { return v[0].reshape({30}); });
  view("view", "split dim 0", [](const Inputs& v) { return v[0].view({2, 3, 5}); });
  view("_unsafe_view", "via matmul grad", [](const Inputs& v) { return v[0].unsqueeze(0).matmul(v[0].t()).squeeze(0); });
  view("expand", "", [](const Inputs& v) { return v[0].unsqueeze(0).expand({2, 6, 5}); });
  view("permute", "", [](const Inputs& v) { return v[0].permute({1, 0}); });
  view("t", "", [](const Inputs& v) { return v[0].t(); }, [](const Inputs& v) { (void)v[0].t_(); });
  view("transpose", "", [](const Inputs& v) { return v[0].transpose(0, 1); },
       [](const Inputs& v) { (void)v[0].transpose_(0, 1); });
  view("unsqueeze", "", [](const Inputs& v) { return v[0].unsqueeze(1); },
       [](const Inputs& v) { (void)v[0].unsqueeze_(1); });
  view("squeeze", "", [](const Inputs& v) { return v[0].unsqueeze(0).squeeze(0); });
  view("select", "dim 0", [](const Inputs& v) { return v[0].select(0, 4); });
  view("select", "dim 1", [](const Inputs& v) { return v[0].select(1, 3); });
  view("slice", "dim 0", [](const Inputs& v) { return v[0].slice(0, 1, 5); });
  view("slice", "dim 1 step 2", [](const Inputs& v) { return v[0].slice(1, 0, 5, 2); });
  view("split", "", [](const Inputs& v) { return at::cat(v[0].split(2, 0), 1); });
  view("split_with_sizes", "", [](const Inputs& v) { return v[0].split_with_sizes({1, 5}, 0)[1]; });
  view("unbind", "", [](const Inputs& v) { return v[0].unbind(1)[2]; });
  view("clone", "", [](const Inputs& v) { return v[0].clone(); });
  view("_to_copy", "", [](const Inputs& v) { return v[0].to(at::kFloat).to(at::kDouble); });
  add({"cat", "", [](uint64_t s) { return reals(s, {kShape, kShape}); },
       [](const Inputs& v) { return at::cat({v[0], v[1]}, 1); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::cat_out(o, {v[0], v[1]}, 1); }});
  add({"stack", "", [](uint64_t s) { return reals(s, {kShape, kShape}); },
       [](const Inputs& v) { return at::stack({v[0], v[1]}, 0); }, nullptr, nullptr});
  // Factories and fills: values (and layouts) depend only on the input's.
  view("ones_like", "", [](const Inputs& v) { return at::ones_like(v[0]) + v[0]; });
  view("zeros_like", "", [](const Inputs& v) { return at::zeros_like(v[0]) + v[0]; });
  view("full_like", "", [](const Inputs& v) { return at::full_like(v[0], 2.0) * v[0]; });
  view("empty_like", "", [](const Inputs& v) { return at::empty_like(v[0]).fill_(1.0) * v[0]; });
  view("new_zeros", "", [](const Inputs& v) { return v[0].new_zeros({3, 2}); });
  view("new_ones", "", [](const Inputs& v) { return v[0].new_ones({3, 2}); });
  view("new_full", "", [](const Inputs& v) { return v[0].new_full({3, 2}, 4.0); });
  view("new_empty", "", [](const Inputs& v) { return v[0].new_empty({3, 2}).fill_(1.0); });
  view("new_empty_strided", "", [](const Inputs& v) { return v[0].new_empty_strided({3, 2}, {1, 3}).fill_(1.0); });
  view("sgn", "", [](const Inputs& v) { return at::sgn(v[0]) * v[0]; });
  view("sign", "", [](const Inputs& v) { return at::sign(v[0]) * v[0]; });
  add({"logical_and", "", [](uint64_t s) { auto v = reals(s, {kShape, kShape}); return Inputs{v[0] > 0, v[1] > 0}; },
       [](const Inputs& v) { return at::logical_and(v[0], v[1]); }, [](const Inputs& v) { (void)v[0].logical_and_(v[1]); },
       [](at::Tensor& o, const Inputs& v) { (void)at::logical_and_out(o, v[0], v[1]); }, false});
  add({"logical_or", "", [](uint64_t s) { auto v = reals(s, {kShape, kShape}); return Inputs{v[0] > 0, v[1] > 0}; },
       [](const Inputs& v) { return at::logical_or(v[0], v[1]); }, [](const Inputs& v) { (void)v[0].logical_or_(v[1]); },
       [](at::Tensor& o, const Inputs& v) { (void)at::logical_or_out(o, v[0], v[1]); }, false});
  add({"logical_xor", "", [](uint64_t s) { auto v = reals(s, {kShape, kShape}); return Inputs{v[0] > 0, v[1] > 0}; },
       [](const Inputs& v) { return at::logical_xor(v[0], v[1]); }, [](const Inputs& v) { (void)v[0].logical_xor_(v[1]); },
       [](at::Tensor& o, const Inputs& v) { (void)at::logical_xor_out(o, v[0], v[1]); }, false});
  add({"fill_", "", [](uint64_t s) { return reals(s, {kShape}); }, [](const Inputs& v) { return v[0] * 1.0; },
       [](const Inputs& v) { (void)v[0].fill_(2.5); }, nullptr, false});
  add({"zero_", "", [](uint64_t s) { return reals(s, {kShape}); }, [](const Inputs& v) { return v[0] * 1.0; },
       [](const Inputs& v) { (void)v[0].zero_(); }, nullptr, false});
  // Indexing.
  add({"gather", "", [](uint64_t s) { return Inputs{random_tensor(kShape, s), (at::arange(30, at::kLong) * 7 % 5).view({6, 5})}; },
       [](const Inputs& v) { return at::gather(v[0], 1, v[1]); }, nullptr, nullptr, true});
  add({"index_select", "", [](uint64_t s) { return Inputs{random_tensor(kShape, s)}; },
       [](const Inputs& v) { return at::index_select(v[0], 0, at::tensor({4, 0, 2}, at::kLong)); }});
  add({"index_add", "", [](uint64_t s) { return Inputs{random_tensor(kShape, s), random_tensor({3, 5}, s + 1)}; },
       [](const Inputs& v) { return at::index_add(v[0], 0, at::tensor({4, 0, 4}, at::kLong), v[1]); },
       [](const Inputs& v) { (void)v[0].index_add_(0, at::tensor({4, 0, 4}, at::kLong), v[1]); }, nullptr});
  add({"scatter", "", [](uint64_t s) { return Inputs{random_tensor(kShape, s), random_tensor(kShape, s + 1)}; },
       [](const Inputs& v) { return at::scatter(v[0], 1, at::arange(5, at::kLong).flip(0).expand({6, 5}).contiguous(), v[1]); },
       nullptr, nullptr, false});
  add({"scatter_add", "", [](uint64_t s) { return Inputs{random_tensor(kShape, s), random_tensor(kShape, s + 1)}; },
       [](const Inputs& v) { return at::scatter_add(v[0], 1, (at::arange(30, at::kLong) % 3).view({6, 5}), v[1]); }});
  add({"embedding", "", [](uint64_t s) { return Inputs{random_tensor({7, 4}, s), (at::arange(10, at::kLong) * 3) % 7}; },
       [](const Inputs& v) { return at::embedding(v[0], v[1]); }, nullptr, nullptr, true});
  return c;
}

// Ops with rules that this table does not call directly, and where they are tested.
const std::map<std::string, std::string>& tested_elsewhere() {
  static const std::map<std::string, std::string> m = {
      {"_log_softmax_backward_data", "the gradient of the _log_softmax cases"},
      {"_softmax_backward_data", "the gradient of the _softmax cases"},
      {"_reshape_alias", "reached through reshape on some LibTorch versions; the view cases"},
      {"embedding_dense_backward", "the gradient of the embedding case"},
      {"gelu_backward", "the gradient of the gelu case"},
      {"sigmoid_backward", "the gradient of the sigmoid case"},
      {"silu_backward", "the gradient of the silu case"},
      {"tanh_backward", "the gradient of the tanh case"},
      {"threshold_backward", "the gradient of the relu case"},
      {"select_backward", "the gradient of the select cases"},
      {"slice_backward", "the gradient of the slice cases"},
      {"nll_loss_forward", "loss_parallel_test.cpp's grid (routed by loss_parallel)"},
      {"nll_loss_backward", "loss_parallel_test.cpp's grid (routed by loss_parallel)"},
      {"nll_loss2d_forward", "loss_parallel_test.cpp's grid (routed by loss_parallel)"},
      {"nll_loss2d_backward", "loss_parallel_test.cpp's grid (routed by loss_parallel)"},
  };
  return m;
}

bool is_random_op(const std::string& op) {
  static const std::set<std::string> random_classes = {"RandomOp"};
  auto rule = find_distributed_op(op);
  return rule && random_classes.count(rule->class_name());
}

// Every combination of Replicate / Shard(d) per mesh dim for one tensor.
std::vector<Placements> placement_options(int64_t tensor_dim, int64_t mesh_ndim) {
  std::vector<Placement> one = {Replicate()};
  for (int64_t d = 0; d < tensor_dim; ++d) one.push_back(Shard(d));
  std::vector<Placements> out = {{}};
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    std::vector<Placements> next;
    for (const auto& p : out) {
      for (const auto& q : one) {
        Placements r = p;
        r.push_back(q);
        next.push_back(r);
      }
    }
    out = next;
  }
  return out;
}

struct Tally {
  int64_t checked = 0, refused = 0;
  std::map<std::string, int64_t> refusal_reasons;  // first line of the error -> count
  std::map<std::string, std::string> refusal_examples;
  std::map<std::string, int64_t> checked_per_op;
  std::vector<std::string> failures;
};

bool close(const at::Tensor& got, const at::Tensor& want) {
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) return false;
  if (!at::isFloatingType(want.scalar_type())) return got.equal(want);
  return at::allclose(got, want, 1e-9, 1e-11, /*equal_nan=*/true);
}

std::string describe(const OpCase& c, const std::string& variant, const std::vector<Placements>& ps,
                     const DeviceMesh& mesh) {
  std::ostringstream os;
  os << c.op << (c.label.empty() ? "" : " (" + c.label + ")") << " " << variant << " on " << mesh.str()
     << " with";
  for (const auto& p : ps) os << " " << to_string(p);
  return os.str();
}

void refuse(Tally& tally, const c10::Error& e, const std::string& what) {
  ++tally.refused;
  std::string reason = e.what_without_backtrace();
  reason = reason.substr(0, reason.find_first_of("\n(")) + " [e.g. " + what + "]";
  ++tally.refusal_reasons[reason.substr(0, reason.find(" [e.g."))];
  tally.refusal_examples.emplace(reason.substr(0, reason.find(" [e.g.")), reason);
}

// Runs one case in one placement combination and variant.
void check_case(const OpCase& c, const std::vector<Placements>& ps, const std::string& variant,
                const Placements& out_placements, const DeviceMesh& mesh, uint64_t seed, Tally& tally) {
  const Inputs full = c.make(seed);
  const size_t placed = c.placed ? c.placed : full.size();
  const bool want_grad = c.grad && variant == "functional";
  Inputs plain, dist;
  for (size_t i = 0; i < full.size(); ++i) {
    at::Tensor p = full[i].clone();
    at::Tensor d = i < placed ? distribute_tensor(full[i], mesh, ps[i]) : full[i].clone();
    if (want_grad && at::isFloatingType(p.scalar_type())) {
      p.requires_grad_();
      d.requires_grad_();
    }
    plain.push_back(p);
    dist.push_back(d);
  }
  const std::string what = describe(c, variant, ps, mesh);
  // One process first, outside the try: an error there is a mistake in the case itself.
  at::Tensor want, got;
  if (variant == "in-place") {
    c.inplace(plain);
    want = plain[0];
  } else {
    want = c.fn(plain);
  }
  try {
    if (variant == "functional") {
      got = c.fn(dist);
    } else if (variant == "in-place") {
      c.inplace(dist);
      got = dist[0];
    } else {
      got = distribute_tensor(at::zeros_like(want), mesh, out_placements);
      c.out(got, dist);
      if (placements_of(got) != out_placements) {
        tally.failures.push_back(what + ": out= changed the out argument's placements to " +
                                 to_string(placements_of(got)));
      }
    }
  } catch (const c10::Error& e) {
    refuse(tally, e, what);  // a clear error on every rank (a one-rank error would hang the others)
    return;
  }
  const at::Tensor got_full = is_dtensor(got) ? full_tensor(got) : got;
  if (!close(got_full, want.detach())) {
    std::ostringstream os;
    os << what << ": got\n" << got_full << "\nexpected\n" << want;
    tally.failures.push_back(os.str());
    return;
  }
  if (want_grad && want.requires_grad()) {
    const at::Tensor g = random_tensor(want.sizes().vec(), seed + 99);
    (want * g).sum().backward();
    try {
      (got * g).sum().backward();
    } catch (const c10::Error& e) {
      refuse(tally, e, what);
      return;
    }
    for (size_t i = 0; i < full.size(); ++i) {
      if (!plain[i].requires_grad()) continue;
      const at::Tensor gp = plain[i].grad();
      const at::Tensor gd = dist[i].grad();
      if (!gp.defined() && !gd.defined()) continue;
      const at::Tensor gd_full = gd.defined() && is_dtensor(gd) ? full_tensor(gd) : gd;
      if (!gp.defined() || !gd.defined() || !close(gd_full, gp)) {
        std::ostringstream os;
        os << what << ": gradient of input " << i << " is\n" << gd_full << "\nexpected\n" << gp;
        tally.failures.push_back(os.str());
        return;
      }
    }
  }
  ++tally.checked;
  ++tally.checked_per_op[c.op];
}

// All cases on one mesh. On a 2-D mesh the first input takes every combination and the
// others are Replicate or follow it, which keeps the count of 4-rank cases modest.
void run_suite(const DeviceMesh& mesh, Tally& tally) {
  uint64_t seed = 1000;
  for (const auto& c : op_cases()) {
    const Inputs proto = c.make(seed);
    const size_t placed = c.placed ? c.placed : proto.size();
    std::vector<std::vector<Placements>> combos = {{}};
    for (size_t i = 0; i < placed; ++i) {
      const auto options = placement_options(proto[i].dim(), mesh.ndim());
      std::vector<std::vector<Placements>> next;
      for (const auto& prefix : combos) {
        for (const auto& p : options) {
          const bool follow = i == 0 || mesh.ndim() == 1 || p == prefix[0] ||
                              p == Placements(mesh.ndim(), Replicate());
          if (!follow) continue;
          auto r = prefix;
          r.push_back(p);
          next.push_back(r);
        }
      }
      combos = next;
    }
    for (const auto& ps : combos) {
      ++seed;
      check_case(c, ps, "functional", {}, mesh, seed, tally);
      if (c.inplace) check_case(c, ps, "in-place", {}, mesh, seed, tally);
      if (c.out) {
        for (const auto& po : {Placements(mesh.ndim(), Replicate()), ps[0]}) {
          check_case(c, ps, "out=", po, mesh, seed, tally);
        }
      }
    }
  }
}

}  // namespace

TEST(OpConformance, EveryOpWithARuleHasCases) {
  run_ranks(1, [](int64_t) {
    (void)init_device_mesh("cpu", {1}, {"tp"});  // loads the registry
    std::set<std::string> covered;
    for (const auto& c : op_cases()) covered.insert(c.op);
    std::vector<std::string> missing;
    for (const auto& op : registered_op_names()) {
      if (!covered.count(op) && !tested_elsewhere().count(op) && !is_random_op(op)) missing.push_back(op);
    }
    EXPECT_TRUE(missing.empty()) << "ops with a rule but no conformance case: " << c10::Join(", ", missing);
  });
}

TEST(OpConformance, EveryCaseMatchesOneProcessOrRefusesOnEveryRank) {
  struct MeshSpec {
    std::vector<int64_t> shape;
  };
  int64_t total_checked = 0, total_refused = 0;
  std::map<std::string, int64_t> per_op;
  for (const MeshSpec& spec : {MeshSpec{{2}}, MeshSpec{{3}}, MeshSpec{{2, 2}}}) {
    int64_t world = 1;
    for (int64_t s : spec.shape) world *= s;
    std::vector<Tally> tallies(world);
    run_ranks(world, [&](int64_t rank) {
      std::vector<std::string> names = spec.shape.size() == 1 ? std::vector<std::string>{"tp"}
                                                              : std::vector<std::string>{"dp", "tp"};
      auto mesh = init_device_mesh("cpu", spec.shape, names);
      run_suite(mesh, tallies[rank]);
    }, std::chrono::seconds(120));
    const Tally& t = tallies[0];
    for (int64_t r = 1; r < world; ++r) {
      EXPECT_EQ(tallies[r].checked, t.checked) << "ranks disagree on which cases they answered";
    }
    for (const auto& f : t.failures) ADD_FAILURE() << f;
    total_checked += t.checked;
    total_refused += t.refused;
    for (const auto& [op, n] : t.checked_per_op) per_op[op] += n;
    for (const auto& [reason, n] : t.refusal_reasons) {
      std::printf("[conformance] refused %lld x: %s\n", static_cast<long long>(n), t.refusal_examples.at(reason).c_str());
    }
  }
  for (const auto& c : op_cases()) {
    EXPECT_GT(per_op[c.op], 0) << c.op << ": every placement combination was refused";
  }
  std::printf("[conformance] %zu ops, %lld cases matched one process, %lld refused with an error\n",
              per_op.size(), static_cast<long long>(total_checked), static_cast<long long>(total_refused));
}
