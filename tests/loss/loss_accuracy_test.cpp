// Every loss path is at least as accurate as PyTorch's own computation in the same dtype:
// the decomposed log_softmax + nll_loss, the fused cross_entropy (class weights, ignored
// rows, label smoothing, probability targets, z-loss, soft-capping, gradient in forward)
// and the fused linear + cross-entropy, in float32, bfloat16 and float16, on logits of
// magnitude 1 to 1e6, TP 1-4. Each path's loss and gradient error against float64 (on the
// same rounded inputs) must stay within 2x ATen's error on the same input in the same dtype.
//
// Two families per magnitude s: spread logits s * randn (the softmax becomes one-hot as s
// grows) and offset logits s + 4 randn (a softmax over many classes with a log-sum-exp near
// s, where a float32 log-sum-exp rounded into one number is 1e-3 off at s = 3e4).
//
// The floor: an error below one rounding of the result (the dtype's unit roundoff u) is the
// best any computation returning that dtype can do, so ATen's loss error counts as at least
// u, and its gradient error as at least the few roundings every element's gradient takes
// (run_sweep says which), since ATen may be exact by luck where another order is not. The fused
// linear path's hidden and weight gradients are products with the logits' gradient: their
// floor is u times how much one rounding of that gradient may move them (conditioning).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <map>
#include <mutex>
#include <string>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

namespace loss_accuracy_test {

using namespace hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

enum class Path { Decomposed, FusedCrossEntropy, FusedLinear };

const char* path_name(Path p) {
  return p == Path::Decomposed          ? "log_softmax + nll_loss"
         : p == Path::FusedCrossEntropy ? "fused cross_entropy"
                                        : "fused linear + cross_entropy";
}

struct Config {
  Path path;
  std::string name;
  bool weighted = false, ignore = false, soft = false, grad_in_forward = false;
  double smoothing = 0, z = 0, cap = 0;
};

std::vector<Config> configs() {
  std::vector<Config> out;
  out.push_back({Path::Decomposed, "plain"});
  out.push_back({Path::Decomposed, "weights+ignore", true, true});
  for (Path p : {Path::FusedCrossEntropy, Path::FusedLinear}) {
    out.push_back({p, "plain"});
    out.push_back({p, "weights+ignore", true, true});
    out.push_back({p, "smoothing+weights", true, true, false, false, 0.1});
    out.push_back({p, "z-loss", false, false, false, false, 0, 1e-4});
    out.push_back({p, "softcap", false, false, false, false, 0, 0, 30});
  }
  out.push_back({Path::FusedCrossEntropy, "probabilities+smoothing", false, false, true, false, 0.1});
  out.push_back({Path::FusedCrossEntropy, "gradient_in_forward+weights", true, true, false, true});
  return out;
}

constexpr int64_t kRows = 16, kClasses = 131, kDim = 32;  // 131: uneven at TP 2, 3 and 4
constexpr double kOffsetSpread = 4;
const std::vector<double> kScales = {1, 30, 1e3, 3e4, 1e6};
const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kBFloat16, at::kHalf};

double unit_roundoff(at::ScalarType t) {
  return t == at::kFloat ? std::ldexp(1.0, -24) : t == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

// The inputs of one case, rounded to its dtype (the float64 reference reads the same values).
struct Inputs {
  at::Tensor logits;          // [rows, classes] (cross-entropy paths)
  at::Tensor hidden, weight;  // [rows, dim], [classes, dim] (fused linear)
  at::Tensor target;          // [rows] int64 or probabilities [rows, classes]
  at::Tensor class_weight;    // [classes] or undefined
  at::Tensor c;               // [rows]: the incoming gradient of the per-row loss
};

Inputs make_inputs(const Config& cfg, double scale, bool offset, at::ScalarType dtype, uint64_t seed) {
  Inputs in;
  if (cfg.path == Path::FusedLinear) {
    at::Tensor h = random_tensor({kRows, kDim}, seed);
    at::Tensor w = random_tensor({kClasses, kDim}, seed + 1) * (scale / std::sqrt(double(kDim)));
    if (offset) {
      // Feature 0 is 1 and its weight s: logits s + N(0, kOffsetSpread^2).
      w = random_tensor({kClasses, kDim}, seed + 1) * (kOffsetSpread / std::sqrt(double(kDim - 1)));
      h.select(1, 0).fill_(1);
      w.select(1, 0).fill_(scale);
    }
    in.hidden = h.to(dtype);
    in.weight = w.to(dtype);
  } else {
    const at::Tensor z = random_tensor({kRows, kClasses}, seed);
    in.logits = (offset ? z * kOffsetSpread + scale : z * scale).to(dtype);
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 2);
  if (cfg.soft) {
    in.target = torch::softmax(random_tensor({kRows, kClasses}, seed + 3) * 2, 1).to(dtype);
  } else {
    in.target = at::randint(kClasses, {kRows}, gen, at::kLong);
    if (cfg.ignore) in.target.masked_fill_(at::rand({kRows}, gen, at::kDouble) < 0.25, -100);
  }
  if (cfg.weighted) in.class_weight = (at::rand({kClasses}, gen, at::kDouble) + 0.5).to(dtype);
  in.c = random_tensor({kRows}, seed + 4).to(dtype);
  return in;
}

// PyTorch's own computation of the per-row loss on plain tensors, in x's dtype:
// y = cap tanh(x / cap); cross_entropy(y) (or nll_loss(log_softmax(x))) + z lse(y)^2.
at::Tensor pytorch_loss(const Config& cfg, const at::Tensor& x, const Inputs& in, at::ScalarType dtype) {
  auto ce = F::CrossEntropyFuncOptions().reduction(torch::kNone).label_smoothing(cfg.smoothing);
  const at::Tensor w = in.class_weight.defined() ? in.class_weight.to(dtype) : at::Tensor();
  if (w.defined()) ce = ce.weight(w);
  const at::Tensor target = cfg.soft ? in.target.to(dtype) : in.target;
  if (cfg.path == Path::Decomposed) {
    auto nll = F::NLLLossFuncOptions().reduction(torch::kNone);
    if (w.defined()) nll = nll.weight(w);
    return F::nll_loss(torch::log_softmax(x, 1), target, nll);
  }
  const at::Tensor y = cfg.cap > 0 ? cfg.cap * torch::tanh(x / cfg.cap) : x;
  at::Tensor loss = F::cross_entropy(y, target, ce);
  if (cfg.z != 0) {
    const at::Tensor valid = cfg.soft ? torch::ones({kRows}, y.options()) : in.target.ne(-100).to(dtype);
    loss = loss + cfg.z * torch::logsumexp(y, 1).square() * valid;
  }
  return loss;
}

// Loss [rows] and gradients (logits; or hidden and weight) of PyTorch's computation.
struct Result {
  at::Tensor loss;
  std::vector<at::Tensor> grads;
  // Of the float64 reference: per gradient, how much a rounding of the logits' gradient
  // alone may move it, relative to it (1 where the gradient is the logits' own).
  std::vector<double> conditioning;
};

Result pytorch_result(const Config& cfg, const Inputs& in, at::ScalarType dtype) {
  Result r;
  if (cfg.path == Path::FusedLinear) {
    // Copies: .to() of the same dtype would hand back (and mark) the shared input itself.
    at::Tensor h = in.hidden.to(dtype).clone().set_requires_grad(true);
    at::Tensor w = in.weight.to(dtype).clone().set_requires_grad(true);
    at::Tensor logits = at::matmul(h, w.t());
    logits.retain_grad();
    r.loss = pytorch_loss(cfg, logits, in, dtype);
    (r.loss * in.c.to(dtype)).sum().backward();
    r.grads = {h.grad(), w.grad()};
    // d hidden = G W and d weight = G^T H: with G rounded (relative error u per element),
    // any order of computing them may be off by u |G| |W| (u |G|^T |H|), and where the
    // classes' terms cancel (large logit offsets) that is far more than u of the result.
    const at::Tensor G = logits.grad().abs(), H = h.detach().abs(), W = w.detach().abs();
    r.conditioning = {(G.mm(W).norm() / r.grads[0].norm()).item<double>(),
                      (G.t().mm(H).norm() / r.grads[1].norm()).item<double>()};
  } else {
    at::Tensor x = in.logits.to(dtype).clone().set_requires_grad(true);
    r.loss = pytorch_loss(cfg, x, in, dtype);
    (r.loss * in.c.to(dtype)).sum().backward();
    r.grads = {x.grad()};
    r.conditioning = {1.0};
  }
  r.loss = r.loss.detach();
  return r;
}

// Ours, on this rank's pieces: full loss and full gradients (every rank gets them).
Result our_result(const Config& cfg, const Inputs& in, const DeviceMesh& mesh) {
  Result r;
  const at::Tensor weight = in.class_weight;
  if (cfg.path == Path::FusedLinear) {
    at::Tensor h = in.hidden.clone().set_requires_grad(true);
    at::Tensor w = distribute_tensor(in.weight, mesh, {Shard(0)}, std::nullopt).set_requires_grad(true);
    FusedLinearCrossEntropyOptions o;
    o.reduction = at::Reduction::None;
    if (weight.defined()) o.class_weight = weight;
    o.label_smoothing = cfg.smoothing;
    o.z_loss_weight = cfg.z;
    o.logit_softcap = cfg.cap;
    at::Tensor loss = to_local(fused_linear_cross_entropy(h, w, in.target, o));
    (loss * in.c).sum().backward();
    r.loss = loss.detach();
    r.grads = {h.grad(), full_tensor(w.grad())};
    return r;
  }
  at::Tensor x = distribute_tensor(in.logits, mesh, {Shard(1)}, std::nullopt).set_requires_grad(true);
  LossParallelOptions o;
  o.z_loss_weight = cfg.z;
  o.logit_softcap = cfg.cap;
  o.gradient_in_forward = cfg.grad_in_forward;
  at::Tensor loss;
  {
    auto guard = loss_parallel(o);
    if (cfg.path == Path::Decomposed) {
      auto nll = F::NLLLossFuncOptions().reduction(torch::kNone);
      if (weight.defined()) nll = nll.weight(weight);
      loss = F::nll_loss(torch::log_softmax(x, 1), in.target, nll);
    } else {
      auto ce = F::CrossEntropyFuncOptions().reduction(torch::kNone).label_smoothing(cfg.smoothing);
      if (weight.defined()) ce = ce.weight(weight);
      loss = F::cross_entropy(x, in.target, ce);
    }
  }
  loss = to_local(loss);
  (loss * in.c).sum().backward();
  r.loss = loss.detach();
  r.grads = {full_tensor(x.grad())};
  return r;
}

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return (g - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-300);
}

struct Case {
  Config cfg;
  double scale;
  bool offset;
  at::ScalarType dtype;
  Inputs in;
  Result ref, aten;  // float64; PyTorch in dtype
  std::string name() const {
    return c10::str(path_name(cfg.path), " ", cfg.name, " ", c10::toString(dtype), offset ? " offset " : " spread ",
                    scale);
  }
};

bool fits_float16(const Result& r) {
  bool fits = r.loss.abs().max().item<double>() <= 65504;
  for (const at::Tensor& g : r.grads) fits = fits && g.abs().max().item<double>() <= 65504;
  return fits;
}

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  uint64_t seed = 7000;
  for (const Config& cfg : configs()) {
    for (double scale : kScales) {
      for (bool offset : {false, true}) {
        for (at::ScalarType dtype : kDtypes) {
          // float16 holds at most 65504: larger logits are infinite before any loss runs.
          if (dtype == at::kHalf && (offset ? scale + 6 * kOffsetSpread : 5 * scale) > 65504) continue;
          Case c{cfg, scale, offset, dtype, make_inputs(cfg, scale, offset, dtype, seed += 10), {}, {}};
          c.ref = pytorch_result(cfg, c.in, at::kDouble);
          // Nor can it hold a loss or gradient past 65504 (the z-loss of a log-sum-exp of 3e4).
          if (dtype == at::kHalf && !fits_float16(c.ref)) continue;
          c.aten = pytorch_result(cfg, c.in, dtype);
          cases.push_back(std::move(c));
        }
      }
    }
  }
  return cases;
}

void run_sweep(const std::vector<Case>& cases) {
  // Worst ours / ATen ratio per path (loss, gradient), over every case and TP degree.
  std::map<std::string, std::pair<double, double>> worst;
  std::mutex mu;
  for (int64_t tp : {1, 2, 3, 4}) {
    run_ranks(tp, [&](int64_t rank) {
      auto mesh = init_device_mesh("cpu", {tp}, {"tp"});
      for (const Case& c : cases) {
        const Result ours = our_result(c.cfg, c.in, mesh);
        if (rank != 0) continue;
        SCOPED_TRACE(c.name() + " TP " + std::to_string(tp));
        const double floor = unit_roundoff(c.dtype);
        const double loss_ratio = rel_err(ours.loss, c.ref.loss) / std::max(rel_err(c.aten.loss, c.ref.loss), floor);
        double grad_ratio = 0;
        for (size_t i = 0; i < ours.grads.size(); ++i) {
          const double e = rel_err(ours.grads[i], c.ref.grads[i]), a = rel_err(c.aten.grads[i], c.ref.grads[i]);
          // A gradient element takes at least two roundings after the softmax (the exp and
          // the product with the coefficients), soft-capping one more (1 - tanh^2), and
          // gradient_in_forward one more by design (it forms the gradient before the incoming
          // one is known, and scales it in backward). Where a case's gradient is a single
          // element (soft-capped logits of 1e6 saturate all others), ATen's error is one
          // draw of that chain: 1.4 u once, where ours was 2.9 u.
          const int roundings = 2 + (c.cfg.cap > 0) + c.cfg.grad_in_forward;
          const double grad_floor = roundings * floor * std::max(1.0, c.ref.conditioning[i]);
          EXPECT_LE(e, 2 * std::max(a, grad_floor))
              << "gradient " << i << ": ours " << e << ", ATen " << a << ", floor " << grad_floor;
          grad_ratio = std::max(grad_ratio, e / std::max(a, grad_floor));
        }
        EXPECT_LE(loss_ratio, 2.0) << "loss: ours " << rel_err(ours.loss, c.ref.loss) << ", ATen "
                                   << rel_err(c.aten.loss, c.ref.loss);
        std::lock_guard<std::mutex> lock(mu);
        auto& w = worst[path_name(c.cfg.path)];
        w.first = std::max(w.first, loss_ratio);
        w.second = std::max(w.second, grad_ratio);
      }
    });
  }
  for (const auto& [path, w] : worst) {
    std::cout << "[ accuracy ] " << path << ": worst ours/ATen error ratio, loss " << w.first << ", gradient "
              << w.second << std::endl;
  }
}

}  // namespace

TEST(LossAccuracy, EveryLossPathIsWithinTwiceAtensErrorInItsDtypeAtEveryLogitScale) { run_sweep(make_cases()); }

}  // namespace loss_accuracy_test
