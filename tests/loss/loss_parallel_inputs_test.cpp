// loss_parallel_inputs_test.cpp — bad inputs to cross_entropy under loss_parallel give
// the same outcome on every rank, with 2 and 4 ranks, in bounded time: the same error
// (an error on one rank and a hang in the loss's collectives on the others is a
// failure), or for NaN/Inf logits the single-process reference's values.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <limits>
#include <mutex>

#include "harness/rank_harness.h"
#include "hyper_parallel/loss/cross_entropy_definition.h"
#include "hyper_parallel/hyper_parallel.h"
#include "loss/math/logits_device.h"
#include "loss/front/loss_parallel_dispatch.h"

namespace loss_parallel_inputs_test {

using namespace hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

constexpr int64_t kRows = 4, kClasses = 8;

std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

// Runs `loss(rank, mesh)` on every rank under loss_parallel; returns each rank's error
// ("" when none) and checks the whole run took less than 20 s (a hang is bounded by 10 s).
std::vector<std::string> errors_on(int64_t ranks,
                                   const std::function<at::Tensor(int64_t rank, const DeviceMesh& mesh)>& loss) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  const auto start = std::chrono::steady_clock::now();
  run_ranks(
      ranks,
      [&](int64_t rank) {
        auto mesh = init_device_mesh("cpu", {ranks});
        auto guard = loss_parallel();
        try {
          at::Tensor l = loss(rank, mesh);
          full_tensor(l);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(rank)] = message_of(e);
        }
      },
      std::chrono::seconds(10));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
  return errors;
}

void expect_same_error(const std::vector<std::string>& errors, const std::string& needle) {
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_NE(errors[r].find(needle), std::string::npos) << "rank " << r << ": '" << errors[r] << "'";
    EXPECT_EQ(errors[r], errors[0]) << "rank " << r << " differs from rank 0";
  }
}

at::Tensor logits_on(const DeviceMesh& mesh) {
  return distribute_tensor(random_tensor({kRows, kClasses}, 21), mesh, {Shard(1)});
}

at::Tensor good_target() { return torch::tensor({0, 3, 5, 7}); }

// The process-wide ParallelismConfig at its defaults (loss_parallel enabled, strict), as
// earlier tests (the Trainer's) may leave another one set; restored afterwards.
class LossParallelInputs : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    saved_ = parallelism_config();
    set_parallelism_config(ParallelismConfig{});
  }
  void TearDown() override { set_parallelism_config(saved_); }
  ParallelismConfig saved_;
};

}  // namespace

TEST_P(LossParallelInputs, ATargetOutOfRangeIsTheSameErrorEverywhere) {
  expect_same_error(errors_on(GetParam(),
                              [](int64_t, const DeviceMesh& m) {
                                return F::cross_entropy(logits_on(m), torch::tensor({0, 3, 999, 7}));
                              }),
                    "out of bounds");
}

TEST_P(LossParallelInputs, ATargetOutOfRangeOnOneRankOnlyIsTheSameErrorEverywhereAndNoHang) {
  expect_same_error(
      errors_on(GetParam(),
                [](int64_t rank, const DeviceMesh& m) {
                  return F::cross_entropy(logits_on(m), rank == 1 ? torch::tensor({0, 3, 999, 7}) : good_target());
                }),
      "rank 1");
}

TEST_P(LossParallelInputs, AWrongTargetDtypeIsRefusedLikeTheReference) {
  // PyTorch: "expected target dtype to be Long or Byte, but got Int".
  expect_same_error(errors_on(GetParam(),
                              [](int64_t, const DeviceMesh& m) {
                                return F::cross_entropy(logits_on(m), good_target().to(torch::kInt));
                              }),
                    "Long or Byte");
  // Byte is accepted, as by PyTorch, and gives ATen's loss and gradient on the full logits.
  const at::Tensor full = random_tensor({kRows, kClasses}, 21);
  const at::Tensor ref = full.clone().set_requires_grad(true);
  const at::Tensor want = F::cross_entropy(ref, good_target().to(torch::kByte));
  want.backward();
  std::mutex m;
  std::vector<std::pair<at::Tensor, at::Tensor>> got(static_cast<size_t>(GetParam()));
  const auto errors = errors_on(GetParam(), [&](int64_t rank, const DeviceMesh& mesh) {
    at::Tensor x = distribute_tensor(full, mesh, {Shard(1)}).set_requires_grad(true);
    at::Tensor l = F::cross_entropy(x, good_target().to(torch::kByte));
    l.backward();
    std::pair<at::Tensor, at::Tensor> mine{full_tensor(l), full_tensor(x.grad())};  // collectives: outside the lock
    std::lock_guard<std::mutex> lock(m);
    got[static_cast<size_t>(rank)] = std::move(mine);
    return l;
  });
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    ASSERT_TRUE(got[r].first.defined() && got[r].second.defined()) << "rank " << r;
    EXPECT_TRUE(torch::allclose(got[r].first, want, 1e-12, 1e-14))
        << "rank " << r << ": " << got[r].first << " vs " << want;
    EXPECT_TRUE(torch::allclose(got[r].second, ref.grad(), 1e-12, 1e-14)) << "rank " << r;
  }
}

TEST_P(LossParallelInputs, AWrongTargetShapeIsTheSameErrorEverywhere) {
  expect_same_error(errors_on(GetParam(),
                              [](int64_t, const DeviceMesh& m) {
                                return F::cross_entropy(logits_on(m), torch::tensor({0, 3, 5}));
                              }),
                    "expected a target of shape");
}

TEST_P(LossParallelInputs, AClassWeightOfTheWrongLengthIsTheSameErrorEverywhere) {
  expect_same_error(errors_on(GetParam(),
                              [](int64_t, const DeviceMesh& m) {
                                return F::cross_entropy(
                                    logits_on(m), good_target(),
                                    F::CrossEntropyFuncOptions().weight(torch::ones({kClasses - 1}, torch::kDouble)));
                              }),
                    "class weight of shape");
}

// PyTorch's cross_entropy refuses a class weight of another dtype than the logits rather
// than converting it.
TEST_P(LossParallelInputs, AClassWeightOfAnotherDtypeIsRefusedAsPyTorchRefusesIt) {
  expect_same_error(errors_on(GetParam(),
                              [](int64_t, const DeviceMesh& m) {
                                return F::cross_entropy(
                                    logits_on(m), good_target(),
                                    F::CrossEntropyFuncOptions().weight(torch::ones({kClasses}, torch::kFloat)));
                              }),
                    "expected scalar type Double but found Float");
}

TEST_P(LossParallelInputs, NanAndInfLogitsGiveTheReferenceValues) {
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), inf, -inf}) {
    SCOPED_TRACE(bad);
    at::Tensor full = random_tensor({kRows, kClasses}, 21);
    full[1][kClasses - 1] = bad;  // on the last rank's shard
    full[2][5] = bad;             // the target class of row 2
    const at::Tensor expected =
        F::cross_entropy(full, good_target(), F::CrossEntropyFuncOptions().reduction(torch::kNone));
    std::mutex m;
    std::vector<at::Tensor> got(static_cast<size_t>(GetParam()));
    const auto errors = errors_on(GetParam(), [&](int64_t rank, const DeviceMesh& mesh) {
      at::Tensor l = F::cross_entropy(distribute_tensor(full, mesh, {Shard(1)}), good_target(),
                                      F::CrossEntropyFuncOptions().reduction(torch::kNone));
      std::lock_guard<std::mutex> lock(m);
      got[static_cast<size_t>(rank)] = full_tensor(l);
      return l;
    });
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_EQ(errors[r], "");
      ASSERT_TRUE(got[r].defined());
      EXPECT_TRUE(torch::allclose(got[r], expected, 1e-9, 1e-9, /*equal_nan=*/true))
          << "rank " << r << ": " << got[r] << " vs reference " << expected;
    }
  }
}

// log_softmax + nll_loss under loss_parallel (the distributed log-sum-exp route, not the
// fused cross-entropy kernel): a +inf logit makes ATen's whole row NaN (x - max is
// inf - inf); -inf and NaN as ATen gives them too. Values and gradients.
TEST_P(LossParallelInputs, NanAndInfLogitsGiveTheReferenceLogSoftmaxNllLossAndGradients) {
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), inf, -inf}) {
    SCOPED_TRACE(bad);
    at::Tensor full = random_tensor({kRows, kClasses}, 21);
    full[1][kClasses - 1] = bad;  // on the last rank's shard
    full[3].fill_(-inf);          // a whole row
    at::Tensor leaf = full.clone().requires_grad_();
    const at::Tensor expected_lsm = at::log_softmax(leaf, 1);
    const at::Tensor expected =
        F::nll_loss(expected_lsm, good_target(), F::NLLLossFuncOptions().reduction(torch::kNone));
    expected.sum().backward();
    std::mutex m;
    std::vector<at::Tensor> lsm(static_cast<size_t>(GetParam())), loss(lsm.size()), grad(lsm.size());
    const auto errors = errors_on(GetParam(), [&](int64_t rank, const DeviceMesh& mesh) {
      at::Tensor x = distribute_tensor(full, mesh, {Shard(1)}).detach().requires_grad_();
      at::Tensor y = at::log_softmax(x, 1);
      at::Tensor l = F::nll_loss(y, good_target(), F::NLLLossFuncOptions().reduction(torch::kNone));
      l.sum().backward();
      at::Tensor full_y = full_tensor(y).detach(), full_l = full_tensor(l).detach(), full_g = full_tensor(x.grad());
      std::lock_guard<std::mutex> lock(m);  // not around the collectives: every rank must reach them
      lsm[static_cast<size_t>(rank)] = full_y;
      loss[static_cast<size_t>(rank)] = full_l;
      grad[static_cast<size_t>(rank)] = full_g;
      return l;
    });
    for (size_t r = 0; r < lsm.size(); ++r) {
      EXPECT_EQ(errors[r], "");
      ASSERT_TRUE(lsm[r].defined() && loss[r].defined() && grad[r].defined());
      EXPECT_TRUE(torch::allclose(lsm[r], expected_lsm.detach(), 1e-12, 1e-12, /*equal_nan=*/true))
          << "rank " << r << " log_softmax: " << lsm[r] << " vs ATen " << expected_lsm;
      EXPECT_TRUE(torch::allclose(loss[r], expected.detach(), 1e-12, 1e-12, /*equal_nan=*/true))
          << "rank " << r << " nll_loss: " << loss[r] << " vs ATen " << expected;
      EXPECT_TRUE(torch::allclose(grad[r], leaf.grad(), 1e-12, 1e-12, /*equal_nan=*/true))
          << "rank " << r << " gradient: " << grad[r] << " vs ATen " << leaf.grad();
    }
  }
}

TEST_P(LossParallelInputs, ATargetThatDiffersBetweenRanksIsNamedWhenChecked) {
  ::setenv("HYPER_PARALLEL_CHECK_REPLICATED", "1", 1);
  const auto errors = errors_on(GetParam(), [](int64_t rank, const DeviceMesh& m) {
    return F::cross_entropy(logits_on(m), rank == 1 ? torch::tensor({1, 3, 5, 7}) : good_target());
  });
  ::unsetenv("HYPER_PARALLEL_CHECK_REPLICATED");
  expect_same_error(errors, "the target differs between ranks");
  EXPECT_NE(errors[0].find("rank(s) 1"), std::string::npos) << errors[0];
  // Without the check the same call runs (a replicated target is the caller's contract).
  for (const auto& e : errors_on(GetParam(), [](int64_t rank, const DeviceMesh&m) {
         return F::cross_entropy(logits_on(m), rank == 1 ? torch::tensor({1, 3, 5, 7}) : good_target());
       })) {
    EXPECT_EQ(e, "");
  }
}

TEST_P(LossParallelInputs, ATargetOnAnotherMeshIsTheSameErrorEverywhere) {
  // Logits on the "tp" dim (2 ranks), the target replicated on the "dp" dim (other ranks).
  const int64_t ranks = GetParam();
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  run_ranks(
      ranks,
      [&](int64_t rank) {
        auto mesh2d = init_device_mesh("cpu", {ranks / 2, 2}, {"dp", "tp"});
        auto guard = loss_parallel();
        try {
          full_tensor(
              F::cross_entropy(logits_on(mesh2d["tp"]), distribute_tensor(good_target(), mesh2d["dp"], {Replicate()})));
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(rank)] = message_of(e);
        }
      },
      std::chrono::seconds(10));
  expect_same_error(errors, "target on the logits' mesh");
}

// A target, probability target or class weight on another device than the logits is
// PyTorch's device-mismatch error, naming both devices, on every rank, before any kernel
// reads it (a CPU target with CUDA logits put a host pointer into the CUDA kernel). Without
// a GPU, meta stands in for the other device: cross_entropy_parallel is called directly, as
// the dispatcher would send a meta target to meta's kernels first. tests/loss/cuda_loss_parallel_test.cpp runs
// the CPU-with-CUDA case on a GPU.
TEST_P(LossParallelInputs, InputsOnAnotherDeviceThanTheLogitsAreAnErrorNamingBoth) {
  const auto ce = [](const at::Tensor& target, const c10::optional<at::Tensor>& weight) {
    return [=](int64_t, const DeviceMesh& m) {
      return cross_entropy_parallel(logits_on(m), target, weight, at::Reduction::Mean, -100, 0.0);
    };
  };
  expect_same_error(errors_on(GetParam(), ce(good_target().to(at::kMeta), c10::nullopt)),
                    "the target is on meta and the logits on cpu");
  expect_same_error(errors_on(GetParam(), ce(good_target(), torch::ones({kClasses}, torch::kDouble).to(at::kMeta))),
                    "the class weight is on meta and the logits on cpu");
  expect_same_error(errors_on(GetParam(), ce(torch::full({kRows, kClasses}, 1.0 / kClasses, at::kDouble).to(at::kMeta),
                                             c10::nullopt)),
                    "the probability target is on meta and the logits on cpu");
}

// PyTorch's rule for probability targets: an ignore_index >= 0 is refused ("ignore_index is
// not supported for floating point target"), a negative one (its default -100 included) has no
// effect. The same outcome on every rank, as on the local-pieces path (vocab_parallel).
TEST_P(LossParallelInputs, AnIgnoreIndexWithProbabilityTargetsFollowsPyTorchsRule) {
  const at::Tensor full = random_tensor({kRows, kClasses}, 21);
  const at::Tensor q = at::softmax(random_tensor({kRows, kClasses}, 22), 1);
  expect_same_error(errors_on(GetParam(),
                              [&](int64_t, const DeviceMesh& m) {
                                return F::cross_entropy(distribute_tensor(full, m, {Shard(1)}), q,
                                                        F::CrossEntropyFuncOptions().ignore_index(3));
                              }),
                    "ignore_index is not supported for floating point target");
  const at::Tensor want = F::cross_entropy(full, q, F::CrossEntropyFuncOptions().ignore_index(-5));
  std::mutex mu;
  std::vector<at::Tensor> got(static_cast<size_t>(GetParam()));
  const auto errors = errors_on(GetParam(), [&](int64_t rank, const DeviceMesh& m) {
    at::Tensor l =
        F::cross_entropy(distribute_tensor(full, m, {Shard(1)}), q, F::CrossEntropyFuncOptions().ignore_index(-5));
    at::Tensor value = full_tensor(l);
    std::lock_guard<std::mutex> lock(mu);
    got[static_cast<size_t>(rank)] = value;
    return l;
  });
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    ASSERT_TRUE(got[r].defined()) << "rank " << r;
    EXPECT_TRUE(torch::allclose(got[r], want, 1e-12, 1e-14)) << "rank " << r << ": " << got[r] << " vs " << want;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, LossParallelInputs, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "Ranks"; });

// One definition check for every front end (loss_input_checks.h): each bad cross-entropy
// definition is refused on every rank by cross_entropy under loss_parallel (c10::Error, as
// PyTorch's cross_entropy raises RuntimeError), vocab_parallel_cross_entropy and the fused
// linear loss (c10::ValueError), with the same words after the op's name.
struct BadDefinition {
  const char* name;
  CrossEntropyDefinition definition;
  const char* words;
};

// The options of a front end whose definition is `d` (each option struct derives from it).
template <typename Options>
Options with_definition(const CrossEntropyDefinition& d) {
  Options o;
  static_cast<CrossEntropyDefinition&>(o) = d;
  return o;
}

TEST(LossDefinition, EveryFrontEndRefusesTheSameBadDefinitionOnEveryRank) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<BadDefinition> cases = {
      {"reduction",
       {{}, /*ignore_index=*/-100, /*reduction=*/7},
       "reduction must be at::Reduction None, Mean or Sum, got 7"},
      {"label_smoothing",
       {{}, -100, at::Reduction::Mean, /*label_smoothing=*/1.5},
       "label_smoothing must be in [0, 1], got 1.5"},
      {"negative z-loss", {{.z_loss_weight = -1e-4}}, "z_loss_weight must be >= 0 and finite (0: off)"},
      {"infinite z-loss", {{.z_loss_weight = inf}}, "z_loss_weight must be >= 0 and finite (0: off), got inf"},
      {"negative soft-cap", {{.logit_softcap = -30}}, "logit_softcap must be >= 0 and finite (0: off), got -30"},
      {"infinite soft-cap", {{.logit_softcap = inf}}, "logit_softcap must be >= 0 and finite (0: off), got inf"},
  };
  constexpr int64_t kRanks = 2;
  const at::Tensor full = random_tensor({kRows, kClasses}, 21);
  const at::Tensor hidden = random_tensor({kRows, 3}, 23), head = random_tensor({kClasses, 3}, 24);
  for (const BadDefinition& c : cases) {
    SCOPED_TRACE(c.name);
    const CrossEntropyDefinition& d = c.definition;
    std::vector<std::string> route(kRanks), local(kRanks), linear(kRanks);
    std::vector<int> value_errors(kRanks, 0);
    run_ranks(
        kRanks,
        [&](int64_t rank) {
          auto mesh = init_device_mesh("cpu", {kRanks});
          const size_t r = static_cast<size_t>(rank);
          try {
            LossParallelOptions guard_options;
            guard_options.z_loss_weight = d.z_loss_weight;
            guard_options.logit_softcap = d.logit_softcap;
            auto guard = loss_parallel(guard_options);
            full_tensor(at::cross_entropy_loss(distribute_tensor(full, mesh, {Shard(1)}), good_target(), c10::nullopt,
                                               d.reduction, d.ignore_index, d.label_smoothing));
          } catch (const c10::ValueError& e) {
            route[r] = "ValueError: " + message_of(e);
          } catch (const std::exception& e) {
            route[r] = message_of(e);
          }
          const auto vo = with_definition<VocabCrossEntropyOptions>(d);
          try {
            const at::Tensor piece = full.chunk(kRanks, 1)[r].contiguous();
            VocabCrossEntropySaved saved;
            vocab_parallel_cross_entropy_forward(piece, 1, good_target(), std::nullopt, &mesh.comm(0), kClasses, vo,
                                                 &saved);
          } catch (const c10::ValueError& e) {
            local[r] = message_of(e);
            ++value_errors[r];
          } catch (const std::exception& e) {
            local[r] = "not a ValueError: " + message_of(e);
          }
          const auto lo = with_definition<FusedLinearCrossEntropyOptions>(d);
          try {
            full_tensor(
                fused_linear_cross_entropy(hidden, distribute_tensor(head, mesh, {Shard(0)}), good_target(), lo));
          } catch (const c10::ValueError& e) {
            linear[r] = message_of(e);
            ++value_errors[r];
          } catch (const std::exception& e) {
            linear[r] = "not a ValueError: " + message_of(e);
          }
        },
        std::chrono::seconds(10));
    expect_same_error(route, std::string("cross_entropy: ") + c.words);
    expect_same_error(local, std::string("vocab_parallel_cross_entropy: ") + c.words);
    expect_same_error(linear, c.words);
    for (size_t r = 0; r < value_errors.size(); ++r) EXPECT_EQ(value_errors[r], 2) << "rank " << r;
  }
}

// The check itself on device descriptors: CUDA logits with a CPU target, no GPU needed.
TEST(LossParallelDevices, TheMismatchNamesBothDevices) {
  try {
    check_on_logits_device(c10::Device("cuda:1"), c10::Device("cpu"), "target", "cross_entropy");
    ADD_FAILURE() << "a CPU target with CUDA logits was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("the target is on cpu and the logits on cuda:1"),
              std::string::npos)
        << e.what_without_backtrace();
  }
  EXPECT_THROW(check_on_logits_device(c10::Device("cuda:0"), c10::Device("cuda:1"), "class weight", "cross_entropy"),
               c10::Error);
  EXPECT_NO_THROW(check_on_logits_device(c10::Device("cuda:1"), c10::Device("cuda:1"), "target", "cross_entropy"));
}

}  // namespace loss_parallel_inputs_test
