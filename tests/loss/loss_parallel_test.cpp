// loss_parallel against single-process cross_entropy on the full logits:
// loss and logits gradient for TP 2, 3, 4, every reduction, weights, ignore_index,
// label smoothing, probability targets, 1-D/2-D/N-D and LM-shaped inputs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <thread>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

namespace loss_parallel_test {

using namespace hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

enum class Target { Index, Soft };

struct Case {
  std::vector<int64_t> shape;  // logits
  int64_t reduction = at::Reduction::Mean;
  bool weighted = false;
  double label_smoothing = 0.0;
  Target target = Target::Index;
  int64_t ignore_index = -100;
  double ignored_fraction = 0.0;  // of index targets set to ignore_index
  std::string name() const {
    std::string s = c10::str(c10::IntArrayRef(shape));
    s += reduction == at::Reduction::None ? " none" : reduction == at::Reduction::Sum ? " sum" : " mean";
    if (weighted) s += " weighted";
    if (label_smoothing > 0) s += " smoothing=" + std::to_string(label_smoothing);
    if (target == Target::Soft) s += " soft";
    if (ignore_index != -100) s += " ignore_index=" + std::to_string(ignore_index);
    if (ignored_fraction > 0) s += " ignored=" + std::to_string(ignored_fraction);
    return s;
  }
};

struct Data {
  at::Tensor logits;  // full, double
  at::Tensor target;
  at::Tensor weight;  // undefined when unweighted
};

Data make_data(const Case& c, uint64_t seed) {
  Data d;
  d.logits = random_tensor(c.shape, seed) * 3;
  const int64_t classes = c.shape.size() == 1 ? c.shape[0] : c.shape[1];
  std::vector<int64_t> tshape = c.shape;
  tshape.erase(tshape.begin() + (c.shape.size() == 1 ? 0 : 1));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  if (c.target == Target::Soft) {
    d.target = torch::softmax(random_tensor(c.shape, seed + 2) * 2, c.shape.size() == 1 ? 0 : 1);
  } else {
    d.target = at::randint(classes, tshape, gen, at::kLong);
    if (c.ignored_fraction > 0) {
      at::Tensor drop = at::rand(tshape, gen, at::kDouble) < c.ignored_fraction;
      d.target.masked_fill_(drop, c.ignore_index);
    }
  }
  if (c.weighted) d.weight = at::rand({classes}, gen, at::kDouble) + 0.5;
  return d;
}

F::CrossEntropyFuncOptions options_for(const Case& c, const at::Tensor& weight) {
  F::CrossEntropyFuncOptions::reduction_t r = torch::kMean;
  if (c.reduction == at::Reduction::None) r = torch::kNone;
  if (c.reduction == at::Reduction::Sum) r = torch::kSum;
  auto o = F::CrossEntropyFuncOptions().reduction(r).ignore_index(c.ignore_index).label_smoothing(c.label_smoothing);
  if (weight.defined()) o = o.weight(weight);
  return o;
}

struct Reference {
  at::Tensor loss, grad;
};

// Single-process cross_entropy on the full logits, in float64; the gradient of
// sum(loss * c) so that 'none' is checked elementwise.
Reference reference(const Case& c, const Data& d, const at::Tensor& c_loss) {
  at::Tensor x = d.logits.clone().set_requires_grad(true);
  at::Tensor loss = F::cross_entropy(x, d.target, options_for(c, d.weight));
  (loss * c_loss).sum().backward();
  return {loss.detach(), x.grad()};
}

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  if (w.isnan().any().item<bool>() || g.isnan().any().item<bool>()) {
    return g.isnan().equal(w.isnan()) && at::allclose(g.nan_to_num(0), w.nan_to_num(0), 1e-6, 1e-9) ? 0 : 1;
  }
  const double denom = std::max(w.norm().item<double>(), 1e-30);
  return (g - w).norm().item<double>() / denom;
}

double tolerance(at::ScalarType t) { return t == at::kDouble ? 1e-12 : t == at::kFloat ? 1e-5 : 1e-2; }

// Runs one case on this rank; returns {loss error, grad error}.
void check_case(const DeviceMesh& mesh, const Case& c, const Data& d, const Reference& ref, const at::Tensor& c_loss,
                at::ScalarType dtype) {
  SCOPED_TRACE(c.name() + " " + c10::toString(dtype) + " TP " + std::to_string(mesh.size()));
  const int64_t class_dim = c.shape.size() == 1 ? 0 : 1;
  at::Tensor logits = distribute_tensor(d.logits.to(dtype), mesh, {Shard(class_dim)}).set_requires_grad(true);
  at::Tensor weight = d.weight.defined() ? d.weight.to(dtype) : at::Tensor();
  at::Tensor target = d.target.is_floating_point() ? d.target.to(dtype) : d.target;
  auto guard = loss_parallel();
  reset_collective_counts();
  at::Tensor loss = F::cross_entropy(logits, target, options_for(c, weight));
  const auto forward = collective_counts();
  // The call's record (fixed size), then the per-row statistics; one rank: the latter.
  const int64_t gathers = mesh.size() == 1 ? 1 : 2;
  EXPECT_EQ(forward.all_gather, gathers) << "the call's record and the per-row statistics";
  EXPECT_EQ(forward.total(), gathers);
  ASSERT_TRUE(is_dtensor(loss));
  EXPECT_TRUE(layout_of(loss).is_replicated()) << to_string(placements_of(loss));
  reset_collective_counts();
  (to_local(loss) * c_loss.to(dtype)).sum().backward();
  EXPECT_EQ(collective_counts().total(), 0) << "the cross_entropy backward needs no collective";
  ASSERT_TRUE(is_dtensor(logits.grad()));
  EXPECT_EQ(layout_of(logits.grad()), layout_of(logits));
  EXPECT_LE(rel_err(to_local(loss), ref.loss), tolerance(dtype)) << to_local(loss) << " vs " << ref.loss;
  // This rank's piece of the reference gradient: no gather needed to compare.
  const Layout& l = layout_of(logits);
  at::Tensor want = ref.grad.narrow(class_dim, l.local_offset()[class_dim], l.local_shape()[class_dim]);
  if (want.numel() > 0) EXPECT_LE(rel_err(to_local(logits.grad()), want), tolerance(dtype));
}

std::vector<Case> small_cases() {
  std::vector<Case> cases;
  for (auto shape : std::vector<std::vector<int64_t>>{{8, 16}, {8, 16, 12}, {16}, {2, 16, 3, 4}}) {
    for (int64_t r : {at::Reduction::None, at::Reduction::Mean, at::Reduction::Sum}) {
      for (bool w : {false, true}) {
        Case base{shape, r, w};
        cases.push_back(base);
        Case ls = base;
        ls.label_smoothing = 0.1;
        ls.ignored_fraction = 0.3;
        cases.push_back(ls);
        Case soft = base;
        soft.target = Target::Soft;
        cases.push_back(soft);
        Case soft_ls = soft;
        soft_ls.label_smoothing = 0.2;
        cases.push_back(soft_ls);
        Case ign = base;
        ign.ignore_index = 3;
        ign.ignored_fraction = 0.3;
        cases.push_back(ign);
        if (shape.size() > 1) {
          Case all = base;
          all.ignore_index = 5;
          all.ignored_fraction = 1.0;
          cases.push_back(all);
          Case all_ls = all;
          all_ls.label_smoothing = 0.1;
          cases.push_back(all_ls);
        }
      }
    }
  }
  return cases;
}

}  // namespace

class LossParallelExact : public ::testing::TestWithParam<int64_t> {};

TEST_P(LossParallelExact, EveryOptionMatchesCrossEntropyOnTheFullLogits) {
  const int64_t tp = GetParam();
  const auto cases = small_cases();
  std::vector<Data> data;
  std::vector<Reference> refs;
  std::vector<at::Tensor> weights_of_loss;
  for (size_t i = 0; i < cases.size(); ++i) {
    data.push_back(make_data(cases[i], 100 + i));
    at::Tensor probe =
        F::cross_entropy(data.back().logits, data.back().target, options_for(cases[i], data.back().weight));
    weights_of_loss.push_back(random_tensor(probe.sizes(), 7000 + i));
    refs.push_back(reference(cases[i], data.back(), weights_of_loss.back()));
  }
  run_ranks(tp, [&](int64_t) {
    auto mesh = init_device_mesh("cpu", {tp}, {"tp"});
    for (size_t i = 0; i < cases.size(); ++i) {
      for (auto dtype : {at::kDouble, at::kFloat})
        check_case(mesh, cases[i], data[i], refs[i], weights_of_loss[i], dtype);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Degrees, LossParallelExact, ::testing::Values(1, 2, 3, 4));

// 4 x 128 tokens, V = 32000 (TP 4) and 32003 (TP 3, uneven), 30 % of the targets ignored.
TEST(LossParallelExact, LanguageModelShapedInputs) {
  const std::vector<std::pair<int64_t, int64_t>> configs = {{32000, at::Reduction::Mean},
                                                            {32000, at::Reduction::Sum},
                                                            {32003, at::Reduction::None},
                                                            {32003, at::Reduction::Mean}};
  for (const auto& [vocab, r] : configs) {
    {
      Case c{{512, vocab}, r};
      c.ignored_fraction = 0.3;
      Data d = make_data(c, vocab);
      at::Tensor probe = F::cross_entropy(d.logits, d.target, options_for(c, d.weight));
      at::Tensor c_loss = random_tensor(probe.sizes(), 9);
      Reference ref = reference(c, d, c_loss);
      const int64_t tp = vocab == 32000 ? 4 : 3;
      run_ranks(tp, [&](int64_t) {
        auto mesh = init_device_mesh("cpu", {tp});
        check_case(mesh, c, d, ref, c_loss, at::kFloat);
        if (c.reduction == at::Reduction::Mean) check_case(mesh, c, d, ref, c_loss, at::kBFloat16);
      });
    }
  }
}

// More ranks than classes: DTensor's Shard leaves the last ranks an empty piece (V = 2 at
// TP 3; V = 5 at TP 4), which still takes part in every collective.
TEST(LossParallelExact, EmptyVocabularyPieces) {
  for (auto [vocab, tp] : {std::pair<int64_t, int64_t>{2, 3}, std::pair<int64_t, int64_t>{5, 4}}) {
    std::vector<Case> cases;
    for (int64_t r : {at::Reduction::None, at::Reduction::Mean}) {
      cases.push_back(Case{{6, vocab}, r, true, 0.1});
      Case soft{{6, vocab}, r};
      soft.target = Target::Soft;
      cases.push_back(soft);
    }
    std::vector<Data> data;
    std::vector<Reference> refs;
    std::vector<at::Tensor> seeds;
    for (size_t i = 0; i < cases.size(); ++i) {
      data.push_back(make_data(cases[i], 300 + i));
      at::Tensor probe =
          F::cross_entropy(data.back().logits, data.back().target, options_for(cases[i], data.back().weight));
      seeds.push_back(random_tensor(probe.sizes(), 400 + i));
      refs.push_back(reference(cases[i], data.back(), seeds.back()));
    }
    run_ranks(tp, [&, tp = tp](int64_t) {
      auto mesh = init_device_mesh("cpu", {tp});
      for (size_t i = 0; i < cases.size(); ++i) check_case(mesh, cases[i], data[i], refs[i], seeds[i], at::kDouble);
      // log_softmax and nll_loss under the same context.
      const at::Tensor full = data[0].logits;
      at::Tensor logits = distribute_tensor(full, mesh, {Shard(1)}).set_requires_grad(true);
      auto guard = loss_parallel();
      at::Tensor lp = torch::log_softmax(logits, 1);
      at::Tensor nll = F::nll_loss(lp, data[0].target);
      nll.backward();
      const at::Tensor ref_x = full.clone().set_requires_grad(true);
      at::Tensor ref_nll = F::nll_loss(torch::log_softmax(ref_x, 1), data[0].target);
      ref_nll.backward();
      EXPECT_LE(rel_err(to_local(nll), ref_nll.detach()), 1e-12);
      const Layout& l = layout_of(logits);
      EXPECT_LE(rel_err(to_local(logits.grad()), ref_x.grad().narrow(1, l.local_offset()[1], l.local_shape()[1])),
                1e-12);
    });
  }
}

}  // namespace loss_parallel_test
