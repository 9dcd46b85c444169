// A Colwise -> Rowwise MLP and an attention block built from plain torch::nn::Linear
// with DTensor weights give the outputs and parameter gradients of one process.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

namespace tp_blocks_test {

using namespace hyper_parallel;
using hyper_parallel::testing::run_ranks;

namespace {

// Deterministic parameters, whatever other rank-threads do with the global RNG.
void init_params(torch::nn::Module& m, uint64_t seed) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) {
    p.copy_(hyper_parallel::testing::random_tensor(p.sizes(), seed++) * 0.3);
  }
}

// Puts `placements` pieces of the module's own (identically seeded) weights in place.
void shard_linear(torch::nn::Linear& lin, const DeviceMesh& mesh, const Placements& weight, const Placements& bias) {
  at::Tensor w = distribute_tensor(lin->weight.detach(), mesh, weight);
  replace_parameter(*lin, "weight", w);
  lin->weight = lin->named_parameters(false)["weight"];
  if (lin->bias.defined()) {
    replace_parameter(*lin, "bias", distribute_tensor(lin->bias.detach(), mesh, bias));
    lin->bias = lin->named_parameters(false)["bias"];
  }
}

void colwise(torch::nn::Linear& lin, const DeviceMesh& mesh) { shard_linear(lin, mesh, {Shard(0)}, {Shard(0)}); }
void rowwise(torch::nn::Linear& lin, const DeviceMesh& mesh) { shard_linear(lin, mesh, {Shard(1)}, {Replicate()}); }

void expect_grads_match(torch::nn::Linear& dist, torch::nn::Linear& ref, const char* what) {
  ASSERT_TRUE(dist->weight.grad().defined()) << what;
  EXPECT_TRUE(is_dtensor(dist->weight.grad())) << what;
  EXPECT_TRUE(torch::allclose(full_tensor(dist->weight.grad()), ref->weight.grad(), 1e-6, 1e-9)) << what;
  if (ref->bias.defined()) {
    EXPECT_TRUE(torch::allclose(full_tensor(dist->bias.grad()), ref->bias.grad(), 1e-6, 1e-9)) << what;
  }
}

struct Mlp {
  torch::nn::Linear w1{nullptr}, w2{nullptr};
  explicit Mlp(int64_t dim, int64_t hidden) {
    w1 = torch::nn::Linear(dim, hidden);
    w2 = torch::nn::Linear(hidden, dim);
    w1->to(torch::kDouble);
    w2->to(torch::kDouble);
    init_params(*w1, 10);
    init_params(*w2, 20);
  }
  at::Tensor forward(const at::Tensor& x) { return w2(torch::silu(w1(x))); }
};

}  // namespace

class TensorParallelBlocks : public ::testing::TestWithParam<int64_t> {};

TEST_P(TensorParallelBlocks, ColwiseRowwiseMlpMatchesOneProcess) {
  const int64_t tp = GetParam();
  run_ranks(tp, [tp](int64_t) {
    auto mesh = init_device_mesh("cpu", {tp}, {"tp"});
    auto x = hyper_parallel::testing::random_tensor({2, 5, 8}, 1);
    auto c = hyper_parallel::testing::random_tensor({2, 5, 8}, 2);
    Mlp ref(8, 12), dist(8, 12);
    at::Tensor y_ref = ref.forward(x);
    (y_ref * c).sum().backward();

    colwise(dist.w1, mesh);
    rowwise(dist.w2, mesh);
    at::Tensor h = torch::silu(dist.w1(x));
    EXPECT_EQ(placements_of(h), Placements{Shard(2)});
    at::Tensor partial = dist.w2(h);
    EXPECT_EQ(placements_of(partial), Placements{Partial()});
    at::Tensor y = to_local(redistribute(partial, {Replicate()}));
    EXPECT_TRUE(torch::allclose(y, y_ref, 1e-9, 1e-12));
    (y * c).sum().backward();
    expect_grads_match(dist.w1, ref.w1, "w1");
    expect_grads_match(dist.w2, ref.w2, "w2");
  });
}

namespace {

struct Attention {
  int64_t n_heads, head_dim;
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  Attention(int64_t dim, int64_t heads) : n_heads(heads), head_dim(dim / heads) {
    uint64_t seed = 30;
    auto make = [&](int64_t i, int64_t o) {
      auto l = torch::nn::Linear(torch::nn::LinearOptions(i, o).bias(false));
      l->to(torch::kDouble);
      init_params(*l, seed += 10);
      return l;
    };
    wq = make(dim, dim);
    wk = make(dim, dim);
    wv = make(dim, dim);
    wo = make(dim, dim);
  }
  // Causal self-attention on whatever heads the projections give this rank (-1 heads),
  // as TorchTitan does with ColwiseParallel(use_local_output=True).
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
    const int64_t b = q.size(0), s = q.size(1);
    auto heads = [&](const at::Tensor& t) { return t.view({b, s, -1, head_dim}).transpose(1, 2); };
    at::Tensor scores = torch::matmul(heads(q), heads(k).transpose(-2, -1)) / std::sqrt(double(head_dim));
    at::Tensor mask = torch::ones({s, s}, torch::kBool).triu(1);
    at::Tensor p = torch::softmax(scores.masked_fill(mask, -1e9), -1);
    return torch::matmul(p, heads(v)).transpose(1, 2).reshape({b, s, -1});
  }
};

}  // namespace

// 4 heads: TP 2 and 4 (3 would split a head; parallelize_module rejects that).
class TensorParallelAttention : public ::testing::TestWithParam<int64_t> {};

TEST_P(TensorParallelAttention, ShardedHeadsMatchOneProcess) {
  const int64_t tp = GetParam();
  run_ranks(tp, [tp](int64_t) {
    auto mesh = init_device_mesh("cpu", {tp}, {"tp"});
    auto x = hyper_parallel::testing::random_tensor({2, 6, 16}, 3);
    auto c = hyper_parallel::testing::random_tensor({2, 6, 16}, 4);
    Attention ref(16, 4), dist(16, 4);
    at::Tensor y_ref = ref.wo(ref.attend(ref.wq(x), ref.wk(x), ref.wv(x)));
    (y_ref * c).sum().backward();

    for (auto* l : {&dist.wq, &dist.wk, &dist.wv}) shard_linear(*l, mesh, {Shard(0)}, {Shard(0)});
    shard_linear(dist.wo, mesh, {Shard(1)}, {Replicate()});
    // Colwise projections hand their local heads to plain attention math ...
    at::Tensor local = dist.attend(to_local(dist.wq(x)), to_local(dist.wk(x)), to_local(dist.wv(x)));
    EXPECT_EQ(local.size(2), 16 / tp);
    // ... and the Rowwise output projection takes them back as Shard(-1).
    at::Tensor out = dist.wo(DTensor::from_local(local, mesh, {Shard(-1)}));
    at::Tensor y = full_tensor(out);
    EXPECT_TRUE(torch::allclose(y, y_ref, 1e-9, 1e-12));
    (y * c).sum().backward();
    for (auto pair : {std::make_pair(&dist.wq, &ref.wq), std::make_pair(&dist.wk, &ref.wk),
                      std::make_pair(&dist.wv, &ref.wv), std::make_pair(&dist.wo, &ref.wo)}) {
      expect_grads_match(*pair.first, *pair.second, "attention projection");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Degrees, TensorParallelBlocks, ::testing::Values(2, 3, 4));
INSTANTIATE_TEST_SUITE_P(Degrees, TensorParallelAttention, ::testing::Values(2, 4));

// Uneven shards (11 rows at TP 2, 3), and more ranks than rows (5 at TP 4: 2, 2, 1, 0; 2 at
// TP 3: 1, 1, 0), where a rank holds no row and still takes part in every collective.
TEST(TensorParallelBlocks, VocabParallelEmbeddingMatchesOneProcess) {
  for (auto [vocab, tp] : {std::pair<int64_t, int64_t>{11, 2}, {11, 3}, {5, 4}, {2, 3}}) {
    for (int64_t padding_idx : {int64_t{-1}, vocab / 2}) {
      run_ranks(tp, [tp = tp, vocab = vocab, padding_idx](int64_t) {
        SCOPED_TRACE("V " + std::to_string(vocab) + " TP " + std::to_string(tp));
        auto mesh = init_device_mesh("cpu", {tp});
        at::Tensor table = hyper_parallel::testing::random_tensor({vocab, 4}, 5);
        at::Tensor ids = torch::tensor({{0, 3, 10, 7}, {5, 5, 1, 9}}, torch::kLong).remainder(vocab);
        at::Tensor c = hyper_parallel::testing::random_tensor({2, 4, 4}, 6);
        at::Tensor ref_w = table.clone().set_requires_grad(true);
        (at::embedding(ref_w, ids, padding_idx) * c).sum().backward();

        at::Tensor w = distribute_tensor(table, mesh, {Shard(0)}).set_requires_grad(true);
        at::Tensor out = at::embedding(w, ids, padding_idx);
        EXPECT_EQ(placements_of(out), Placements{Partial()});
        at::Tensor y = full_tensor(out);
        EXPECT_TRUE(torch::allclose(y, torch::embedding(table, ids)));
        (y * c).sum().backward();
        // Each rank scatters into its own rows: the gradient is born Shard(0), V/tp x D.
        EXPECT_EQ(placements_of(w.grad()), Placements{Shard(0)});
        EXPECT_EQ(to_local(w.grad()).sizes(), to_local(w).sizes());
        EXPECT_TRUE(torch::allclose(full_tensor(w.grad()), ref_w.grad()));
      });
    }
  }
}

TEST(ParallelStyles, ColwiseOutputAlreadyInItsLayoutIsNotRedistributed) {
  // Shard(-1) and the output's Shard(1) are the same placement: no redistribute node, and
  // the output and the weight's gradient are one process's (the same input on every rank).
  const at::Tensor x = hyper_parallel::testing::random_tensor({3, 4}, 7);
  const at::Tensor c = hyper_parallel::testing::random_tensor({3, 6}, 8);
  const at::Tensor w0 = hyper_parallel::testing::random_tensor({6, 4}, 9);
  const at::Tensor ref_w = w0.clone().set_requires_grad(true);
  const at::Tensor y_ref = at::matmul(x, ref_w.t());
  (y_ref * c).sum().backward();
  run_ranks(2, [&](int64_t) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    torch::nn::Linear lin(torch::nn::LinearOptions(4, 6).bias(false));
    lin->to(torch::kDouble);
    {
      torch::NoGradGuard no_grad;
      lin->weight.copy_(w0);
    }
    torch::nn::Sequential model(lin);
    parallelize_module(*model, mesh,
                       {{"0", ColwiseParallel::make({.output_layouts = {{Shard(-1)}}, .use_local_output = false})}});
    at::Tensor y = parallel_forward(lin, x);
    ASSERT_TRUE(is_dtensor(y));
    ASSERT_TRUE(y.grad_fn());
    EXPECT_NE(y.grad_fn()->name(), "hyper_parallel::RedistributeBackward");
    EXPECT_EQ(placements_of(y), Placements{Shard(1)});
    EXPECT_TRUE(torch::allclose(full_tensor(y), y_ref, 1e-12, 1e-14));
    (y * distribute_tensor(c, mesh, {Shard(1)})).sum().backward();
    ASSERT_TRUE(lin->weight.grad().defined());
    EXPECT_TRUE(torch::allclose(full_tensor(lin->weight.grad()), ref_w.grad(), 1e-12, 1e-14));
  });
}

}  // namespace tp_blocks_test
