// The conformance suite: every op with a layout rule, called on DTensors — 1-D meshes of
// 2 and 3 ranks (even and uneven pieces) and a 2 x 2 mesh; every input in every
// placement (Replicate, Shard(d), Partial(sum) for floating-point inputs) — in its
// functional form and in every in-place and out= form ATen has, must give what one
// process computes on the full tensors (value, and input gradients of the functional and
// in-place forms where differentiable), or refuse with an error on every rank. Nothing
// else passes. On the 1-D meshes every combination of the inputs' placements runs; on the
// 2 x 2 mesh every input takes every placement with the others replicated, following it,
// or interleaved with it (placement_combos).
//
// The cases are generated: each op contributes how to call it (a few lines in the table
// below); the placements, variants and meshes are enumerated here. A test fails when an
// op in the registry has neither a table entry nor a stated reason to be tested elsewhere,
// so a new rule cannot go untested. The totals per family (the rule's class) are printed
// and recorded in docs/ops.md.
#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

namespace op_conformance_test {

using namespace hyper_parallel;
using hyper_parallel::testing::run_ranks;

namespace {

using Inputs = std::vector<at::Tensor>;
using Fn = std::function<at::Tensor(const Inputs&)>;
using InplaceFn = std::function<void(const Inputs&)>;               // writes into inputs[0]
using OutFn = std::function<void(at::Tensor& out, const Inputs&)>;  // computes what fn returns, into out

struct OpCase {
  std::string op;                             // registry name it exercises
  std::string label;                          // distinguishes several cases of one op
  std::function<Inputs(uint64_t seed)> make;  // full inputs, identical on every rank
  Fn fn;
  InplaceFn inplace;                 // optional
  OutFn out;                         // optional
  bool grad = true;                  // compare input gradients too (functional and in-place)
  size_t placed = 0;                 // inputs to distribute (0: all)
  bool under_loss_parallel = false;  // the distributed call runs inside loss_parallel()
};

// Random values on a 2^-20 grid, |x| < 8: sums of a few of them are exact in float64, so a
// Partial input's addends (below) add up to exactly the full tensor.
at::Tensor dyadic(c10::IntArrayRef shape, uint64_t seed) {
  return at::round(hyper_parallel::testing::random_tensor(shape, seed) * (1 << 20)) / (1 << 20);
}
Inputs reals(uint64_t seed, std::vector<std::vector<int64_t>> shapes) {
  Inputs v;
  for (size_t i = 0; i < shapes.size(); ++i) v.push_back(dyadic(shapes[i], seed + i));
  return v;
}
Inputs positives(uint64_t seed, std::vector<std::vector<int64_t>> shapes) {
  Inputs v = reals(seed, std::move(shapes));
  for (auto& t : v) t = t.abs() + 0.5;
  return v;
}
const std::vector<int64_t> kShape = {6, 5};  // 6 splits evenly over 2 and 3 ranks, 5 does not

// clang-format 14 misplaces a stringified macro argument: these two stay as written.
// clang-format off
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
// clang-format on

// Log-probabilities over `classes` along dim 1 and targets with some ignored (-100).
Inputs nll_inputs(uint64_t seed, std::vector<int64_t> shape, bool weighted) {
  Inputs v = {at::log_softmax(dyadic(shape, seed) * 2, 1)};
  std::vector<int64_t> tshape = shape;
  tshape.erase(tshape.begin() + 1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  at::Tensor t = at::randint(shape[1], tshape, gen, at::kLong);
  v.push_back(t.masked_fill(at::rand(tshape, gen, at::kDouble) < 0.25, -100));
  if (weighted) v.push_back(positives(seed + 2, {{shape[1]}})[0]);
  return v;
}

std::vector<OpCase> op_cases() {
  std::vector<OpCase> c = {
      HP_UNARY(abs, reals),
      HP_UNARY(cos, reals),
      HP_UNARY(exp, reals),
      HP_UNARY(log, positives),
      HP_UNARY(neg, reals),
      HP_UNARY(reciprocal, positives),
      HP_UNARY(rsqrt, positives),
      HP_UNARY(sigmoid, reals),
      HP_UNARY(sin, reals),
      HP_UNARY(sqrt, positives),
      HP_UNARY(tanh, reals),
      HP_UNARY(silu, reals),
      HP_UNARY(square, reals),
      HP_BINARY(add, reals, true),
      HP_BINARY(sub, reals, true),
      HP_BINARY(mul, reals, true),
      HP_BINARY(div, positives, true),
      HP_BINARY(pow, positives, true),
      HP_BINARY(eq, reals, false),
      HP_BINARY(ne, reals, false),
      HP_BINARY(lt, reals, false),
      HP_BINARY(le, reals, false),
      HP_BINARY(gt, reals, false),
      HP_BINARY(ge, reals, false),
  };
  auto add = [&](OpCase x) { c.push_back(std::move(x)); };
  add({"sgn", "", [](uint64_t s) { return reals(s, {kShape}); }, [](const Inputs& v) { return at::sgn(v[0]); },
       [](const Inputs& v) { (void)v[0].sgn_(); }, [](at::Tensor& o, const Inputs& v) { (void)at::sgn_out(o, v[0]); }});
  add({"sign", "", [](uint64_t s) { return reals(s, {kShape}); }, [](const Inputs& v) { return at::sign(v[0]); },
       [](const Inputs& v) { (void)v[0].sign_(); },
       [](at::Tensor& o, const Inputs& v) { (void)at::sign_out(o, v[0]); }});
  // maximum, minimum and where have no in-place form in ATen.
  add({"maximum", "",
       [](uint64_t s) {
         return reals(s, {kShape, kShape});
       },
       [](const Inputs& v) { return at::maximum(v[0], v[1]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::maximum_out(o, v[0], v[1]); }});
  add({"minimum", "",
       [](uint64_t s) {
         return reals(s, {kShape, kShape});
       },
       [](const Inputs& v) { return at::minimum(v[0], v[1]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::minimum_out(o, v[0], v[1]); }});
  add({"relu", "", [](uint64_t s) { return reals(s, {kShape}); }, [](const Inputs& v) { return at::relu(v[0]); },
       [](const Inputs& v) { (void)at::relu_(const_cast<at::Tensor&>(v[0])); },
       [](at::Tensor& o, const Inputs& v) { (void)at::relu_out(o, v[0]); }});
  add({"gelu", "", [](uint64_t s) { return reals(s, {kShape}); }, [](const Inputs& v) { return at::gelu(v[0]); },
       [](const Inputs& v) { (void)at::gelu_(const_cast<at::Tensor&>(v[0])); },
       [](at::Tensor& o, const Inputs& v) { (void)at::gelu_out(o, v[0]); }});
  add({"logical_not", "", [](uint64_t s) { return Inputs{reals(s, {kShape})[0] > 0}; },
       [](const Inputs& v) { return at::logical_not(v[0]); }, [](const Inputs& v) { (void)v[0].logical_not_(); },
       [](at::Tensor& o, const Inputs& v) { (void)at::logical_not_out(o, v[0]); }, false});
  add({"bitwise_not", "", [](uint64_t s) { return Inputs{(reals(s, {kShape})[0] * 10).to(at::kLong)}; },
       [](const Inputs& v) { return at::bitwise_not(v[0]); }, [](const Inputs& v) { (void)v[0].bitwise_not_(); },
       [](at::Tensor& o, const Inputs& v) { (void)at::bitwise_not_out(o, v[0]); }, false});
  add({"add", "alpha + broadcast row",
       [](uint64_t s) {
         return reals(s, {kShape, {1, 5}});
       },
       [](const Inputs& v) { return at::add(v[0], v[1], 0.5); }, [](const Inputs& v) { (void)v[0].add_(v[1], 0.5); },
       [](at::Tensor& o, const Inputs& v) { (void)at::add_out(o, v[0], v[1], 0.5); }});
  add({"mul", "scalar", [](uint64_t s) { return reals(s, {kShape}); }, [](const Inputs& v) { return v[0] * 3.0; },
       [](const Inputs& v) { (void)v[0].mul_(3.0); },
       [](at::Tensor& o, const Inputs& v) { (void)at::mul_out(o, v[0], at::Scalar(3.0)); }});
  add({"clamp", "", [](uint64_t s) { return reals(s, {kShape}); },
       [](const Inputs& v) { return at::clamp(v[0], -0.5, 0.5); },
       [](const Inputs& v) { (void)v[0].clamp_(-0.5, 0.5); },
       [](at::Tensor& o, const Inputs& v) { (void)at::clamp_out(o, v[0], -0.5, 0.5); }});
  add({"lerp", "",
       [](uint64_t s) {
         return reals(s, {kShape, kShape, kShape});
       },
       [](const Inputs& v) { return at::lerp(v[0], v[1], v[2]); },
       [](const Inputs& v) { (void)v[0].lerp_(v[1], v[2]); },
       [](at::Tensor& o, const Inputs& v) { (void)at::lerp_out(o, v[0], v[1], v[2]); }});
  add({"addcmul", "",
       [](uint64_t s) {
         return reals(s, {kShape, kShape, kShape});
       },
       [](const Inputs& v) { return at::addcmul(v[0], v[1], v[2], 0.5); },
       [](const Inputs& v) { (void)v[0].addcmul_(v[1], v[2], 0.5); },
       [](at::Tensor& o, const Inputs& v) { (void)at::addcmul_out(o, v[0], v[1], v[2], 0.5); }});
  add({"addcdiv", "",
       [](uint64_t s) {
         return positives(s, {kShape, kShape, kShape});
       },
       [](const Inputs& v) { return at::addcdiv(v[0], v[1], v[2], 0.5); },
       [](const Inputs& v) { (void)v[0].addcdiv_(v[1], v[2], 0.5); },
       [](at::Tensor& o, const Inputs& v) { (void)at::addcdiv_out(o, v[0], v[1], v[2], 0.5); }});
  add({"where", "",
       [](uint64_t s) {
         auto v = reals(s, {kShape, kShape, kShape});
         v[0] = v[0] > 0;
         return v;
       },
       [](const Inputs& v) { return at::where(v[0], v[1], v[2]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::where_out(o, v[0], v[1], v[2]); }});
  add({"masked_fill", "",
       [](uint64_t s) {
         auto v = reals(s, {kShape, kShape});
         v[1] = v[1] > 0;
         return v;
       },
       [](const Inputs& v) { return at::masked_fill(v[0], v[1], -1.0); },
       [](const Inputs& v) { (void)v[0].masked_fill_(v[1], -1.0); },
       [](at::Tensor& o, const Inputs& v) { (void)at::masked_fill_out(o, v[0], v[1], at::Scalar(-1.0)); }});
  // Matmuls (their gradients also run mm/t/sum in every layout). mm and bmm have no in-place form.
  add({"mm", "",
       [](uint64_t s) {
         return reals(s, {{6, 5}, {5, 4}});
       },
       [](const Inputs& v) { return at::mm(v[0], v[1]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::mm_out(o, v[0], v[1]); }});
  add({"addmm", "",
       [](uint64_t s) {
         return reals(s, {{4}, {6, 5}, {5, 4}});
       },
       [](const Inputs& v) { return at::addmm(v[0], v[1], v[2]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::addmm_out(o, v[0], v[1], v[2]); }});
  add({"addmm", "full self",
       [](uint64_t s) {
         return reals(s, {{6, 4}, {6, 5}, {5, 4}});
       },
       [](const Inputs& v) { return at::addmm(v[0], v[1], v[2], 0.5, 2.0); },
       [](const Inputs& v) { (void)v[0].addmm_(v[1], v[2], 0.5, 2.0); },
       [](at::Tensor& o, const Inputs& v) { (void)at::addmm_out(o, v[0], v[1], v[2], 0.5, 2.0); }});
  add({"bmm", "",
       [](uint64_t s) {
         return reals(s, {{3, 6, 5}, {3, 5, 4}});
       },
       [](const Inputs& v) { return at::bmm(v[0], v[1]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::bmm_out(o, v[0], v[1]); }});
  // Reductions (none has an in-place form).
  auto reduction = [&](const char* op, const char* label, Fn fn, OutFn out, bool grad = true) {
    add({op, label, [](uint64_t s) { return reals(s, {kShape}); }, std::move(fn), nullptr, std::move(out), grad});
  };
  reduction(
      "sum", "all", [](const Inputs& v) { return v[0].sum(); },
      [](at::Tensor& o, const Inputs& v) {
        (void)at::sum_out(o, v[0], {0, 1});
      });
  reduction(
      "sum", "dim 0", [](const Inputs& v) { return v[0].sum(0); },
      [](at::Tensor& o, const Inputs& v) { (void)at::sum_out(o, v[0], {0}); });
  reduction(
      "sum", "dim 1 keepdim", [](const Inputs& v) { return v[0].sum(1, true); },
      [](at::Tensor& o, const Inputs& v) { (void)at::sum_out(o, v[0], {1}, true); });
  reduction(
      "mean", "all", [](const Inputs& v) { return v[0].mean(); },
      [](at::Tensor& o, const Inputs& v) {
        (void)at::mean_out(o, v[0], {0, 1});
      });
  reduction(
      "mean", "dim 1", [](const Inputs& v) { return v[0].mean(1); },
      [](at::Tensor& o, const Inputs& v) { (void)at::mean_out(o, v[0], {1}); });
  reduction(
      "amax", "dim 1", [](const Inputs& v) { return v[0].amax(1); },
      [](at::Tensor& o, const Inputs& v) { (void)at::amax_out(o, v[0], {1}); });
  reduction(
      "amin", "dim 0", [](const Inputs& v) { return v[0].amin(0); },
      [](at::Tensor& o, const Inputs& v) { (void)at::amin_out(o, v[0], {0}); });
  reduction(
      "argmax", "dim 1", [](const Inputs& v) { return v[0].argmax(1); },
      [](at::Tensor& o, const Inputs& v) { (void)at::argmax_out(o, v[0], 1); }, false);
  reduction(
      "argmin", "dim 0", [](const Inputs& v) { return v[0].argmin(0); },
      [](at::Tensor& o, const Inputs& v) { (void)at::argmin_out(o, v[0], 0); }, false);
  // max/min with a dim write values and indices: the out= form takes both.
  reduction(
      "max", "dim 1", [](const Inputs& v) { return std::get<0>(v[0].max(1)); },
      [](at::Tensor& o, const Inputs& v) {
        at::Tensor idx = is_dtensor(o) ? distribute_tensor(at::zeros(o.sizes(), at::kLong), mesh_of(o),
                                                           placements_of(o), std::nullopt)
                                       : at::zeros(o.sizes(), at::kLong);
        (void)at::max_out(o, idx, v[0], 1);
      });
  reduction(
      "min", "dim 0", [](const Inputs& v) { return std::get<0>(v[0].min(0)); },
      [](at::Tensor& o, const Inputs& v) {
        at::Tensor idx = is_dtensor(o) ? distribute_tensor(at::zeros(o.sizes(), at::kLong), mesh_of(o),
                                                           placements_of(o), std::nullopt)
                                       : at::zeros(o.sizes(), at::kLong);
        (void)at::min_out(o, idx, v[0], 0);
      });
  reduction(
      "prod", "dim 1", [](const Inputs& v) { return v[0].prod(1); },
      [](at::Tensor& o, const Inputs& v) { (void)at::prod_out(o, v[0], 1); });
  reduction(
      "logsumexp", "dim 1", [](const Inputs& v) { return v[0].logsumexp(1); },
      [](at::Tensor& o, const Inputs& v) { (void)at::logsumexp_out(o, v[0], {1}); });
  reduction(
      "_softmax", "dim 1", [](const Inputs& v) { return at::softmax(v[0], 1); },
      [](at::Tensor& o, const Inputs& v) { (void)at::_softmax_out(o, v[0], 1, false); });
  reduction(
      "_softmax", "dim 0", [](const Inputs& v) { return at::softmax(v[0], 0); },
      [](at::Tensor& o, const Inputs& v) { (void)at::_softmax_out(o, v[0], 0, false); });
  reduction(
      "_log_softmax", "dim 1", [](const Inputs& v) { return at::log_softmax(v[0], 1); },
      [](at::Tensor& o, const Inputs& v) { (void)at::_log_softmax_out(o, v[0], 1, false); });
  // Views and shape ops: the in-place forms ATen has (t_, transpose_, unsqueeze_, squeeze_).
  auto view = [&](const char* op, const char* label, Fn fn, InplaceFn inplace = nullptr, OutFn out = nullptr) {
    add({op, label, [](uint64_t s) { return reals(s, {kShape}); }, std::move(fn), std::move(inplace), std::move(out)});
  };
  view("view", "flatten", [](const Inputs& v) { return v[0].reshape({30}); });
  view("view", "split dim 0", [](const Inputs& v) { return v[0].view({2, 3, 5}); });
  view("_unsafe_view", "via matmul grad",
       [](const Inputs& v) { return v[0].unsqueeze(0).matmul(v[0].t()).squeeze(0); });
  view("expand", "", [](const Inputs& v) { return v[0].unsqueeze(0).expand({2, 6, 5}); });
  view("permute", "", [](const Inputs& v) { return v[0].permute({1, 0}); });
  view(
      "t", "", [](const Inputs& v) { return v[0].t(); }, [](const Inputs& v) { (void)v[0].t_(); });
  view(
      "transpose", "", [](const Inputs& v) { return v[0].transpose(0, 1); },
      [](const Inputs& v) { (void)v[0].transpose_(0, 1); });
  view(
      "unsqueeze", "", [](const Inputs& v) { return v[0].unsqueeze(1); },
      [](const Inputs& v) { (void)v[0].unsqueeze_(1); });
  view("squeeze", "", [](const Inputs& v) { return v[0].unsqueeze(0).squeeze(0); });
  add({"squeeze", "dim 1 of [6, 1, 5]",
       [](uint64_t s) {
         return reals(s, {{6, 1, 5}});
       },
       [](const Inputs& v) { return v[0].squeeze(1); }, [](const Inputs& v) { (void)v[0].squeeze_(1); }, nullptr});
  view("select", "dim 0", [](const Inputs& v) { return v[0].select(0, 4); });
  view("select", "dim 1", [](const Inputs& v) { return v[0].select(1, 3); });
  view("slice", "dim 0", [](const Inputs& v) { return v[0].slice(0, 1, 5); });
  view("slice", "dim 1 step 2", [](const Inputs& v) { return v[0].slice(1, 0, 5, 2); });
  view("split", "", [](const Inputs& v) { return at::cat(v[0].split(2, 0), 1); });
  view("split_with_sizes", "", [](const Inputs& v) { return v[0].split_with_sizes({1, 5}, 0)[1]; });
  view("unbind", "", [](const Inputs& v) { return v[0].unbind(1)[2]; });
  view(
      "clone", "", [](const Inputs& v) { return v[0].clone(); }, nullptr,
      [](at::Tensor& o, const Inputs& v) { (void)at::clone_out(o, v[0]); });
  view("_to_copy", "", [](const Inputs& v) { return v[0].to(at::kFloat).to(at::kDouble); });
  view(
      "_to_copy", "same dtype", [](const Inputs& v) { return at::_to_copy(v[0]); }, nullptr,
      [](at::Tensor& o, const Inputs& v) { (void)at::_to_copy_out(o, v[0]); });
  add({"cat", "",
       [](uint64_t s) {
         return reals(s, {kShape, kShape});
       },
       [](const Inputs& v) {
         return at::cat({v[0], v[1]}, 1);
       },
       nullptr,
       [](at::Tensor& o, const Inputs& v) {
         (void)at::cat_out(o, {v[0], v[1]}, 1);
       }});
  add({"stack", "",
       [](uint64_t s) {
         return reals(s, {kShape, kShape});
       },
       [](const Inputs& v) {
         return at::stack({v[0], v[1]}, 0);
       },
       nullptr,
       [](at::Tensor& o, const Inputs& v) {
         (void)at::stack_out(o, {v[0], v[1]}, 0);
       }});
  // Factories and fills: values (and layouts) depend only on the input's. The *_like cases
  // add the input so that a gradient flows; their out= forms do the same into `out`.
  view(
      "ones_like", "", [](const Inputs& v) { return at::ones_like(v[0]) + v[0]; }, nullptr,
      [](at::Tensor& o, const Inputs& v) { (void)at::ones_like_out(o, v[0]).add_(v[0]); });
  view(
      "zeros_like", "", [](const Inputs& v) { return at::zeros_like(v[0]) + v[0]; }, nullptr,
      [](at::Tensor& o, const Inputs& v) { (void)at::zeros_like_out(o, v[0]).add_(v[0]); });
  view(
      "full_like", "", [](const Inputs& v) { return at::full_like(v[0], 2.0) * v[0]; }, nullptr,
      [](at::Tensor& o, const Inputs& v) { (void)at::full_like_out(o, v[0], 2.0).mul_(v[0]); });
  view(
      "empty_like", "", [](const Inputs& v) { return at::empty_like(v[0]).fill_(1.0) * v[0]; }, nullptr,
      [](at::Tensor& o, const Inputs& v) { (void)at::empty_like_out(o, v[0]).fill_(1.0).mul_(v[0]); });
  view(
      "new_zeros", "",
      [](const Inputs& v) {
        return v[0].new_zeros({3, 2});
      },
      nullptr,
      [](at::Tensor& o, const Inputs& v) {
        (void)at::new_zeros_out(o, v[0], {3, 2});
      });
  view(
      "new_ones", "",
      [](const Inputs& v) {
        return v[0].new_ones({3, 2});
      },
      nullptr,
      [](at::Tensor& o, const Inputs& v) {
        (void)at::new_ones_out(o, v[0], {3, 2});
      });
  view(
      "new_full", "",
      [](const Inputs& v) {
        return v[0].new_full({3, 2}, 4.0);
      },
      nullptr,
      [](at::Tensor& o, const Inputs& v) {
        (void)at::new_full_out(o, v[0], {3, 2}, 4.0);
      });
  view(
      "new_empty", "",
      [](const Inputs& v) {
        return v[0].new_empty({3, 2}).fill_(1.0);
      },
      nullptr,
      [](at::Tensor& o, const Inputs& v) {
        (void)at::new_empty_out(o, v[0], {3, 2}).fill_(1.0);
      });
  view(
      "new_empty_strided", "",
      [](const Inputs& v) {
        return v[0].new_empty_strided({3, 2}, {1, 3}).fill_(1.0);
      },
      nullptr,
      [](at::Tensor& o, const Inputs& v) {
        (void)at::new_empty_strided_out(o, v[0], {3, 2}, {1, 3}).fill_(1.0);
      });
  add({"logical_and", "",
       [](uint64_t s) {
         auto v = reals(s, {kShape, kShape});
         return Inputs{v[0] > 0, v[1] > 0};
       },
       [](const Inputs& v) { return at::logical_and(v[0], v[1]); },
       [](const Inputs& v) { (void)v[0].logical_and_(v[1]); },
       [](at::Tensor& o, const Inputs& v) { (void)at::logical_and_out(o, v[0], v[1]); }, false});
  add({"logical_or", "",
       [](uint64_t s) {
         auto v = reals(s, {kShape, kShape});
         return Inputs{v[0] > 0, v[1] > 0};
       },
       [](const Inputs& v) { return at::logical_or(v[0], v[1]); },
       [](const Inputs& v) { (void)v[0].logical_or_(v[1]); },
       [](at::Tensor& o, const Inputs& v) { (void)at::logical_or_out(o, v[0], v[1]); }, false});
  add({"logical_xor", "",
       [](uint64_t s) {
         auto v = reals(s, {kShape, kShape});
         return Inputs{v[0] > 0, v[1] > 0};
       },
       [](const Inputs& v) { return at::logical_xor(v[0], v[1]); },
       [](const Inputs& v) { (void)v[0].logical_xor_(v[1]); },
       [](at::Tensor& o, const Inputs& v) { (void)at::logical_xor_out(o, v[0], v[1]); }, false});
  // fill_ and zero_: their functional forms at::fill / at::zero (ATen's composites run
  // empty_like + fill_ and clone + zero_ on the DTensor) and their out= forms.
  add({"fill_", "", [](uint64_t s) { return reals(s, {kShape}); }, [](const Inputs& v) { return at::fill(v[0], 2.5); },
       [](const Inputs& v) { (void)v[0].fill_(2.5); },
       [](at::Tensor& o, const Inputs& v) { (void)at::fill_out(o, v[0], 2.5); }});
  add({"zero_", "", [](uint64_t s) { return reals(s, {kShape}); }, [](const Inputs& v) { return at::zero(v[0]); },
       [](const Inputs& v) { (void)v[0].zero_(); },
       [](at::Tensor& o, const Inputs& v) { (void)at::zero_out(o, v[0]); }});
  // Indexing.
  const auto cols = [] { return (at::arange(30, at::kLong) * 7 % 5).view({6, 5}); };
  add({"gather", "",
       [cols](uint64_t s) {
         return Inputs{dyadic(kShape, s), cols()};
       },
       [](const Inputs& v) { return at::gather(v[0], 1, v[1]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::gather_out(o, v[0], 1, v[1]); }});
  add({"index_select", "", [](uint64_t s) { return Inputs{dyadic(kShape, s)}; },
       [](const Inputs& v) {
         return at::index_select(v[0], 0, at::tensor({4, 0, 2}, at::kLong));
       },
       nullptr,
       [](at::Tensor& o, const Inputs& v) {
         (void)at::index_select_out(o, v[0], 0, at::tensor({4, 0, 2}, at::kLong));
       }});
  add({"index_add", "",
       [](uint64_t s) {
         return Inputs{dyadic(kShape, s), dyadic({3, 5}, s + 1)};
       },
       [](const Inputs& v) {
         return at::index_add(v[0], 0, at::tensor({4, 0, 4}, at::kLong), v[1]);
       },
       [](const Inputs& v) {
         (void)v[0].index_add_(0, at::tensor({4, 0, 4}, at::kLong), v[1]);
       },
       [](at::Tensor& o, const Inputs& v) {
         (void)at::index_add_out(o, v[0], 0, at::tensor({4, 0, 4}, at::kLong), v[1]);
       }});
  const auto perm = [] { return at::arange(5, at::kLong).flip(0).expand({6, 5}).contiguous(); };
  add({"scatter", "",
       [](uint64_t s) {
         return Inputs{dyadic(kShape, s), dyadic(kShape, s + 1)};
       },
       [perm](const Inputs& v) { return at::scatter(v[0], 1, perm(), v[1]); },
       [perm](const Inputs& v) { (void)v[0].scatter_(1, perm(), v[1]); },
       [perm](at::Tensor& o, const Inputs& v) { (void)at::scatter_out(o, v[0], 1, perm(), v[1]); }, false});
  const auto thirds = [] { return (at::arange(30, at::kLong) % 3).view({6, 5}); };
  add({"scatter_add", "",
       [](uint64_t s) {
         return Inputs{dyadic(kShape, s), dyadic(kShape, s + 1)};
       },
       [thirds](const Inputs& v) { return at::scatter_add(v[0], 1, thirds(), v[1]); },
       [thirds](const Inputs& v) { (void)v[0].scatter_add_(1, thirds(), v[1]); },
       [thirds](at::Tensor& o, const Inputs& v) { (void)at::scatter_add_out(o, v[0], 1, thirds(), v[1]); }});
  add({"embedding", "",
       [](uint64_t s) {
         return Inputs{dyadic({7, 4}, s), (at::arange(10, at::kLong) * 3) % 7};
       },
       [](const Inputs& v) { return at::embedding(v[0], v[1]); }, nullptr,
       [](at::Tensor& o, const Inputs& v) { (void)at::embedding_out(o, v[0], v[1]); }});
  // NLL outside loss_parallel (the ordinary rule: a class-sharded input is a
  // LossParallelLayoutError on every rank) and inside it (the distributed kernels), with
  // ignored targets, class weights, mean and none (sum is mean's numerator: the loss
  // tests run all three reductions); nll_loss2d on [N, C, H, W].
  using Red = at::Reduction::Reduction;
  for (bool inside : {false, true}) {
    const std::string where = inside ? " under loss_parallel" : "";
    for (Red r : {at::Reduction::Mean, at::Reduction::None}) {
      const std::string red = r == at::Reduction::Mean ? "mean" : r == at::Reduction::Sum ? "sum" : "none";
      add({"nll_loss_forward", "nll_loss " + red + where,
           [](uint64_t s) {
             return nll_inputs(s, {6, 5}, false);
           },
           [r](const Inputs& v) { return at::nll_loss(v[0], v[1], {}, r); }, nullptr,
           [r](at::Tensor& o, const Inputs& v) { (void)at::nll_loss_out(o, v[0], v[1], {}, r); }, true, 0, inside});
      add({"nll_loss_forward", "nll_loss weighted " + red + where,
           [](uint64_t s) {
             return nll_inputs(s, {6, 5}, true);
           },
           [r](const Inputs& v) { return at::nll_loss(v[0], v[1], v[2], r); }, nullptr,
           [r](at::Tensor& o, const Inputs& v) { (void)at::nll_loss_out(o, v[0], v[1], v[2], r); }, true, 2, inside});
      add({"nll_loss2d_forward", "nll_loss2d " + red + where,
           [r](uint64_t s) {
             return nll_inputs(s, {2, 5, 3, 2}, r == at::Reduction::Mean);
           },
           [r](const Inputs& v) { return at::nll_loss2d(v[0], v[1], v.size() > 2 ? v[2] : at::Tensor(), r); }, nullptr,
           [r](at::Tensor& o, const Inputs& v) {
             (void)at::nll_loss2d_out(o, v[0], v[1], v.size() > 2 ? v[2] : at::Tensor(), r);
           },
           true, 2, inside});
    }
  }
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
      {"fill", "the functional form of the fill_ case"},
      {"zero", "the functional form of the zero_ case"},
      {"nll_loss_backward", "the gradient of the nll_loss cases"},
      {"nll_loss2d_backward", "the gradient of the nll_loss2d cases"},
  };
  return m;
}

bool is_random_op(const std::string& op) {
  static const std::set<std::string> random_classes = {"RandomOp"};
  auto rule = find_distributed_op(op);
  return rule && random_classes.count(rule->class_name());
}

// Every way of taking one element of each of `choices`, in order.
template <typename T>
std::vector<std::vector<T>> product(const std::vector<std::vector<T>>& choices) {
  std::vector<std::vector<T>> out = {{}};
  for (const auto& options : choices) {
    std::vector<std::vector<T>> next;
    for (const auto& prefix : out) {
      for (const auto& o : options) {
        next.push_back(prefix);
        next.back().push_back(o);
      }
    }
    out = std::move(next);
  }
  return out;
}

// Every combination of Replicate / Shard(d) / Partial(sum) per mesh dim for one tensor
// (Partial only for floating-point tensors: a sum of boolean or index pieces means nothing).
std::vector<Placements> placement_options(int64_t tensor_dim, int64_t mesh_ndim, bool partial) {
  std::vector<Placement> one = {Replicate()};
  for (int64_t d = 0; d < tensor_dim; ++d) one.push_back(Shard(d));
  if (partial) one.push_back(Partial());
  return product(std::vector<std::vector<Placement>>(static_cast<size_t>(mesh_ndim), one));
}

// The placement combinations of a case's inputs. On a 1-D mesh: all of them. On a 2-D
// mesh, where that product grows to thousands for three inputs: every input takes every
// option while the others are Replicate, all inputs take the same option, and an
// interleaving pairs each option of input 0 with different options of the others — so
// every input takes every placement, with mixed layouts beside it.
std::vector<std::vector<Placements>> placement_combos(const std::vector<std::vector<Placements>>& options,
                                                      int64_t mesh_ndim) {
  if (options.empty() || mesh_ndim == 1) return product(options);
  std::vector<std::vector<Placements>> out;
  std::set<std::vector<std::string>> seen;
  auto push = [&](const std::vector<Placements>& combo) {
    std::vector<std::string> key;
    for (const auto& p : combo) key.push_back(to_string(p));
    if (seen.insert(key).second) out.push_back(combo);
  };
  const Placements replicated(static_cast<size_t>(mesh_ndim), Replicate());
  for (size_t i = 0; i < options.size(); ++i) {
    for (const auto& p : options[i]) {
      std::vector<Placements> combo(options.size(), replicated);
      combo[i] = p;
      push(combo);
    }
  }
  const size_t n0 = options[0].size();
  for (size_t k = 0; k < n0; ++k) {
    std::vector<Placements> same;
    for (const auto& opts : options) {
      auto it = std::find(opts.begin(), opts.end(), options[0][k]);
      same.push_back(it != opts.end() ? *it : opts[k % opts.size()]);
    }
    push(same);
    std::vector<Placements> mixed;
    for (size_t i = 0; i < options.size(); ++i) mixed.push_back(options[i][(k + 5 * i) % options[i].size()]);
    push(mixed);
  }
  return out;
}

// `full` as a DTensor with placements `ps`. A Partial(sum) mesh dim holds unequal addends
// that sum exactly to the value (dyadic inputs), nested like the reductions that undo them.
at::Tensor distribute_input(const at::Tensor& full, const DeviceMesh& mesh, const Placements& ps, uint64_t seed) {
  Placements plain = ps;
  at::Tensor v = full;
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    if (!ps[m].is_partial()) continue;
    plain[m] = Replicate();
    const int64_t n = mesh.size(m), c = mesh.coordinate()[m];
    at::Tensor rest = at::zeros_like(v), mine;
    for (int64_t k = 0; k < n - 1; ++k) {
      at::Tensor r = dyadic(full.sizes(), seed + 100 * (m + 1) + k);
      rest += r;
      if (k == c) mine = r;
    }
    v = c < n - 1 ? mine : v - rest;
  }
  // std::nullopt: each rank's own value, no collective (the source-rank default would
  // broadcast rank 0's addend to every rank).
  if (plain == ps) return distribute_tensor(full, mesh, ps, std::nullopt);
  at::Tensor local = to_local(distribute_tensor(v, mesh, plain, std::nullopt));
  return DTensor::from_local(local, mesh, ps, FromLocalOptions{false, full.sizes().vec(), std::nullopt});
}

// What was answered, per family (the rule's DistributedOp class) and variant.
struct Tally {
  int64_t checked = 0, refused = 0;
  std::map<std::string, int64_t> refusal_reasons;  // first line of the error -> count
  std::map<std::string, std::string> refusal_examples;
  std::map<std::string, int64_t> checked_per_op;
  std::map<std::string, std::map<std::string, int64_t>> per_family;  // family -> column -> count
  std::vector<std::string> failures;
};

std::string family_of(const std::string& op) {
  auto rule = find_distributed_op(op);
  return rule ? rule->class_name() : "(no rule)";
}

bool close(const at::Tensor& got, const at::Tensor& want) {
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) return false;
  if (!at::isFloatingType(want.scalar_type())) return got.equal(want);
  return at::allclose(got, want, 1e-9, 1e-11, /*equal_nan=*/true);
}

std::string describe(const OpCase& c, const std::string& variant, const std::vector<Placements>& ps,
                     const DeviceMesh& mesh) {
  std::ostringstream os;
  os << c.op << (c.label.empty() ? "" : " (" + c.label + ")") << " " << variant << " on " << mesh.str() << " with";
  for (const auto& p : ps) os << " " << to_string(p);
  return os.str();
}

// c10::Error, or the loss_parallel errors (std::invalid_argument / std::runtime_error).
void refuse(Tally& tally, const std::string& family, const std::exception& e, const std::string& what) {
  ++tally.refused;
  ++tally.per_family[family]["refused"];
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string reason = c10_error ? c10_error->what_without_backtrace() : e.what();
  reason = reason.substr(0, reason.find_first_of("\n(")) + " [e.g. " + what + "]";
  ++tally.refusal_reasons[reason.substr(0, reason.find(" [e.g."))];
  tally.refusal_examples.emplace(reason.substr(0, reason.find(" [e.g.")), reason);
}

// Runs one case in one placement combination and variant. Gradients are compared for the
// functional and the in-place forms (the latter on a clone of each leaf, as autograd
// requires); out= forms do not support autograd in ATen.
void check_case(const OpCase& c, const std::vector<Placements>& ps, const std::string& variant,
                const Placements& out_placements, const DeviceMesh& mesh, uint64_t seed, Tally& tally) {
  const Inputs full = c.make(seed);
  const size_t placed = c.placed ? c.placed : full.size();
  const bool want_grad = c.grad && variant != "out=";
  const auto family = [&] { return family_of(c.op); };  // asked once the op has run (and loaded the registry)
  Inputs plain, dist;
  for (size_t i = 0; i < full.size(); ++i) {
    at::Tensor p = full[i].clone();
    at::Tensor d = i < placed ? distribute_input(full[i], mesh, ps[i], seed * 7 + i) : full[i].clone();
    if (want_grad && i < placed && at::isFloatingType(p.scalar_type())) {
      p.requires_grad_();
      d.requires_grad_();
    }
    plain.push_back(p);
    dist.push_back(d);
  }
  // The in-place forms write into input 0: a clone when it is a leaf that needs a gradient.
  Inputs plain_args = plain, dist_args = dist;
  if (variant == "in-place" && plain[0].requires_grad()) {
    plain_args[0] = plain[0].clone();
    dist_args[0] = dist[0].clone();
  }
  const std::string what = describe(c, variant, ps, mesh);
  // One process first, outside the try: an error there is a mistake in the case itself.
  at::Tensor want, got;
  if (variant == "in-place") {
    c.inplace(plain_args);
    want = plain_args[0];
  } else {
    want = c.fn(plain_args);
  }
  // An out= placement that cannot describe the output (a shard of a dim it lacks) is no case.
  for (const auto& p : out_placements) {
    if (p.is_shard() && p.dim() >= want.dim()) return;
  }
  try {
    std::optional<LossParallelGuard> guard;
    if (c.under_loss_parallel) guard.emplace(loss_parallel());
    if (variant == "functional") {
      got = c.fn(dist_args);
    } else if (variant == "in-place") {
      c.inplace(dist_args);
      got = dist_args[0];
    } else {
      got = distribute_tensor(at::zeros_like(want), mesh, out_placements, std::nullopt);
      c.out(got, dist_args);
      if (placements_of(got) != out_placements) {
        tally.failures.push_back(what + ": out= changed the out argument's placements to " +
                                 to_string(placements_of(got)));
      }
    }
  } catch (const std::exception& e) {
    refuse(tally, family(), e, what);  // a clear error on every rank (a one-rank error would hang the others)
    return;
  }
  const at::Tensor got_full = is_dtensor(got) ? full_tensor(got) : got;
  if (!close(got_full, want.detach())) {
    std::ostringstream os;
    os << what << ": got\n" << got_full << "\nexpected\n" << want;
    tally.failures.push_back(os.str());
    return;
  }
  bool grads = false;
  if (want_grad && want.requires_grad()) {
    const at::Tensor g = dyadic(want.sizes().vec(), seed + 99);
    (want * g).sum().backward();
    try {
      (got * g).sum().backward();
    } catch (const std::exception& e) {
      refuse(tally, family(), e, what + " (backward)");
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
      grads = true;
    }
  }
  ++tally.checked;
  ++tally.checked_per_op[c.op];
  ++tally.per_family[family()][variant];
  if (grads) ++tally.per_family[family()]["with gradients"];
}

// All cases on one mesh.
// The cases of part `part` of `parts` (every parts-th case), on one mesh.
void run_suite(const DeviceMesh& mesh, int64_t part, int64_t parts, Tally& tally) {
  uint64_t seed = 1000;
  const std::vector<OpCase> cases = op_cases();
  for (size_t index = part; index < cases.size(); index += parts) {
    const OpCase& c = cases[index];
    const Inputs proto = c.make(seed);
    const size_t placed = c.placed ? c.placed : proto.size();
    std::vector<std::vector<Placements>> options;
    for (size_t i = 0; i < placed; ++i) {
      options.push_back(placement_options(proto[i].dim(), mesh.ndim(), at::isFloatingType(proto[i].scalar_type())));
    }
    for (const auto& ps : placement_combos(options, mesh.ndim())) {
      ++seed;
      check_case(c, ps, "functional", {}, mesh, seed, tally);
      if (c.inplace) check_case(c, ps, "in-place", {}, mesh, seed, tally);
      if (c.out) {
        // out= placed like input 0 everywhere; a Replicate out (every rank gathers) on the
        // 1-D meshes, where the 2-D mesh would only repeat it along a second dim.
        check_case(c, ps, "out=", ps[0], mesh, seed, tally);
        if (mesh.ndim() == 1) check_case(c, ps, "out=", Placements(1, Replicate()), mesh, seed, tally);
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

// The sweep on one mesh (part `part` of `parts` of the cases), its counts printed per family
// (the rule's class). Split by mesh, and the 2 x 2 mesh in two: ctest runs them side by
// side, and each stays well inside its time limit under ASan (the whole 2 x 2 sweep: 107 s).
void run_conformance_on(const std::vector<int64_t>& shape, int64_t part = 0, int64_t parts = 1) {
  // The process-wide config at its defaults (an earlier test may leave the gathering
  // fallback for class-sharded NLL on), restored afterwards.
  const ParallelismConfig saved = parallelism_config();
  set_parallelism_config(ParallelismConfig{});
  const auto start = std::chrono::steady_clock::now();
  int64_t world = 1;
  for (int64_t s : shape) world *= s;
  std::vector<Tally> tallies(world);
  run_ranks(
      world,
      [&](int64_t rank) {
        std::vector<std::string> names =
            shape.size() == 1 ? std::vector<std::string>{"tp"} : std::vector<std::string>{"dp", "tp"};
        auto mesh = init_device_mesh("cpu", shape, names);
        run_suite(mesh, part, parts, tallies[rank]);
      },
      std::chrono::seconds(280));
  set_parallelism_config(saved);
  const Tally& t = tallies[0];
  for (int64_t r = 1; r < world; ++r) {
    EXPECT_EQ(tallies[r].checked, t.checked) << "ranks disagree on which cases they answered";
    EXPECT_EQ(tallies[r].failures.size(), t.failures.size()) << "rank " << r;
  }
  for (const auto& f : t.failures) ADD_FAILURE() << f;
  for (const auto& [reason, n] : t.refusal_reasons) {
    std::printf("[conformance] refused %lld x: %s\n", static_cast<long long>(n), t.refusal_examples.at(reason).c_str());
  }
  const std::vector<OpCase> cases = op_cases();
  for (size_t index = part; index < cases.size(); index += parts) {
    const OpCase& c = cases[index];
    EXPECT_GT(t.checked_per_op.count(c.op) ? t.checked_per_op.at(c.op) : 0, 0)
        << c.op << ": every placement combination was refused";
  }
  std::map<std::string, std::set<std::string>> ops_per_family;
  for (const auto& [op, n] : t.checked_per_op) ops_per_family[family_of(op)].insert(op);
  for (const auto& entry : t.per_family) {
    const std::string& family = entry.first;
    const auto& columns = entry.second;  // a plain reference: clang's C++20 lambdas cannot capture bindings
    auto n = [&](const char* k) { return static_cast<long long>(columns.count(k) ? columns.at(k) : 0); };
    std::printf(
        "[conformance] %-14s %2zu ops: %5lld functional, %5lld in-place, %5lld out= matched (%5lld with gradients), "
        "%4lld refused\n",
        family.c_str(), ops_per_family[family].size(), n("functional"), n("in-place"), n("out="), n("with gradients"),
        n("refused"));
  }
  std::printf(
      "[conformance] mesh %s, part %lld of %lld: %zu ops, %lld cases matched one process, %lld refused with an error, "
      "in %.1f s\n",
      c10::Join(" x ", shape).c_str(), static_cast<long long>(part + 1), static_cast<long long>(parts),
      t.checked_per_op.size(), static_cast<long long>(t.checked), static_cast<long long>(t.refused),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

TEST(OpConformance, EveryCaseOnAMeshOf2MatchesOneProcessOrRefusesOnEveryRank) { run_conformance_on({2}); }
TEST(OpConformance, EveryCaseOnAMeshOf3MatchesOneProcessOrRefusesOnEveryRank) { run_conformance_on({3}); }
TEST(OpConformance, EveryEvenCaseOnA2x2MeshMatchesOneProcessOrRefusesOnEveryRank) { run_conformance_on({2, 2}, 0, 2); }
TEST(OpConformance, EveryOddCaseOnA2x2MeshMatchesOneProcessOrRefusesOnEveryRank) { run_conformance_on({2, 2}, 1, 2); }

}  // namespace op_conformance_test
