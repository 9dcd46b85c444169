// The op registry: names, YAML specs, plugins, errors, and the layout cache.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <dirent.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>

#include "harness/build_paths.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/dispatch/sharding_strategy.h"
#include "dtensor/dtensor_impl.h"
#include "loss/front/loss_parallel_dispatch.h"
#include "ops/pointwise_ops.h"

namespace op_registry_test {

using namespace hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;

namespace {

// Sets the registry's environment for one test and restores the built-in registry after.
class RegistryEnv {
 public:
  RegistryEnv(const char* yaml_dir, const char* plugins) {
    if (yaml_dir) setenv("HYPER_PARALLEL_OPS_YAML_DIR", yaml_dir, 1);
    if (plugins) setenv("HYPER_PARALLEL_OPS_PLUGIN_PATH", plugins, 1);
  }
  ~RegistryEnv() {
    unsetenv("HYPER_PARALLEL_OPS_YAML_DIR");
    unsetenv("HYPER_PARALLEL_OPS_PLUGIN_PATH");
    reload_distributed_ops();
  }
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

const std::string kData = hyper_parallel::testing::source_dir() + "/tests/data";

}  // namespace

TEST(OpRegistry, OpNamesDropNamespaceAndOverload) {
  auto& d = c10::Dispatcher::singleton();
  EXPECT_EQ(get_op_name(*d.findSchema({"aten::_log_softmax", ""})), "_log_softmax");
  EXPECT_EQ(get_op_name(*d.findSchema({"aten::sum", "dim_IntList"})), "sum");
  EXPECT_EQ(get_op_name(*d.findSchema({"aten::nll_loss_forward", ""})), "nll_loss_forward");
}

TEST(OpRegistry, BuiltInSpecsNameTheirFiles) {
  run_ranks(1, [](int64_t) {
    init_device_mesh("cpu", {1});
    distribute_tensor(at::ones({1}), init_device_mesh("cpu", {1}), {Replicate()});
  });
  auto origins = distributed_op_origins();
  ASSERT_TRUE(origins.count("mm"));
  EXPECT_NE(origins["mm"].find("ops/matrix.yaml:"), std::string::npos) << origins["mm"];
  EXPECT_NE(origins["add"].find("ops/pointwise.yaml:"), std::string::npos);
}

TEST(OpRegistry, YamlDirAndPluginAddWorkingOps) {
  RegistryEnv env((kData + "/ops_yaml").c_str(), hyper_parallel::testing::rule_plugin_path().c_str());
  reload_distributed_ops();
  auto origins = distributed_op_origins();
  EXPECT_NE(origins["flip"].find("extra_ops.yaml:2"), std::string::npos) << origins["flip"];
  EXPECT_NE(origins["cumsum"].find("plugin"), std::string::npos) << origins["cumsum"];
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor a = random_tensor({4, 6}, 1);
    at::Tensor d = distribute_tensor(a, mesh, {Shard(1)});
    at::Tensor f = at::flip(d, {0});  // rule from the plugin class, declared in YAML
    EXPECT_EQ(placements_of(f), Placements{Shard(1)});
    EXPECT_TRUE(full_tensor(f).equal(at::flip(a, {0})));
    at::Tensor c = at::cumsum(d, 1);  // op registered by the plugin itself
    EXPECT_EQ(placements_of(c), Placements{Replicate()});
    EXPECT_TRUE(at::allclose(full_tensor(c), at::cumsum(a, 1)));
    at::Tensor h = at::hardtanh(d);  // built-in class, new op name from YAML
    EXPECT_EQ(placements_of(h), Placements{Shard(1)});
    EXPECT_TRUE(full_tensor(h).equal(at::hardtanh(a)));
  });
}

TEST(OpRegistry, MalformedSpecNamesFileAndLine) {
  RegistryEnv env((kData + "/bad_yaml").c_str(), nullptr);
  const std::string msg = error_of([] { reload_distributed_ops(); });
  EXPECT_NE(msg.find("broken.yaml:3"), std::string::npos) << msg;
}

TEST(OpRegistry, DuplicateOpNameNamesBothFiles) {
  RegistryEnv env((kData + "/dup_yaml").c_str(), nullptr);
  const std::string msg = error_of([] { reload_distributed_ops(); });
  EXPECT_NE(msg.find("ops/pointwise.yaml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dup.yaml:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'add'"), std::string::npos) << msg;
}

TEST(OpRegistry, AnUnknownClassParameterValueNamesEntryKeyAndChoices) {
  RegistryEnv env((kData + "/bad_choice_yaml").c_str(), nullptr);
  const std::string msg = error_of([] { reload_distributed_ops(); });
  EXPECT_NE(msg.find("bad_kind.yaml:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("PermuteOp kind 'diagonal' is not one of permute, transpose, t"), std::string::npos) << msg;
}

// ops/*.yaml is the one list of the ops loss_parallel routes: a spec's `loss_parallel:`
// key binds an op to a kernel, a name that is no kernel is an error at its line.
TEST(OpRegistry, ALossParallelKeyBindsTheOpToANamedKernel) {
  {
    RegistryEnv env((kData + "/loss_kernel_yaml").c_str(), nullptr);
    reload_distributed_ops();
    auto names = loss_parallel_op_names();
    EXPECT_NE(std::find(names.begin(), names.end(), "log_softmax_test_only"), names.end());
    EXPECT_THROW(unregister_loss_parallel_op_names({"log_softmax_test_only"}), c10::ValueError)
        << "bound by a spec: built in";
    EXPECT_TRUE(find_distributed_op("log_softmax_test_only")) << "the class takes the rest of the entry";
  }
  auto names = loss_parallel_op_names();
  EXPECT_EQ(std::find(names.begin(), names.end(), "log_softmax_test_only"), names.end()) << "gone with its spec";
  for (const char* n : {"_log_softmax", "nll_loss_backward"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n << " comes from ops/*.yaml";
  }
  RegistryEnv env((kData + "/bad_loss_kernel_yaml").c_str(), nullptr);
  const std::string msg = error_of([] { reload_distributed_ops(); });
  EXPECT_NE(msg.find("bad_loss_kernel.yaml:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("loss_parallel kernel 'log_sofmax', which does not exist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("log_softmax, log_softmax_backward, nll_backward, nll_forward"), std::string::npos) << msg;
}

TEST(OpRegistry, PluginWithoutEntryPointNamesTheSymbol) {
  RegistryEnv env(nullptr, hyper_parallel::testing::no_entry_point_plugin_path().c_str());
  const std::string msg = error_of([] { reload_distributed_ops(); });
  EXPECT_NE(msg.find("hyper_parallel_register_ops"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no_entry_point"), std::string::npos) << msg;
  RegistryEnv missing(nullptr, "/nonexistent/plugin.so");
  EXPECT_NE(error_of([] { reload_distributed_ops(); }).find("/nonexistent/plugin.so"), std::string::npos);
}

TEST(LayoutCache, RepeatedOpHitsAndEveryKeyPartMisses) {
  run_ranks(1, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {1});
    at::Tensor a = distribute_tensor(random_tensor({4, 6}, 1), mesh, {Shard(0)});
    clear_layout_cache();
    at::sum(a, {1});
    auto s0 = layout_cache_stats();
    EXPECT_EQ(s0.misses, 1);
    at::sum(a, {1});
    EXPECT_EQ(layout_cache_stats().hits, s0.hits + 1) << "the same op, layout and arguments";
    auto misses = [&] { return layout_cache_stats().misses; };
    int64_t m = misses();
    at::sum(distribute_tensor(random_tensor({4, 6}, 1), mesh, {Replicate()}), {1});
    EXPECT_EQ(misses(), m + 1) << "a changed layout";
    at::sum(distribute_tensor(random_tensor({5, 6}, 1), mesh, {Shard(0)}), {1});
    EXPECT_EQ(misses(), m + 2) << "a changed shape";
    at::sum(a, {0});
    EXPECT_EQ(misses(), m + 3) << "a changed static argument";
    {
      ScopedLayoutCacheToken token(42);
      at::sum(a, {1});
      EXPECT_EQ(misses(), m + 4) << "a changed context token";
    }
    at::sum(a, {1});
    EXPECT_EQ(misses(), m + 4) << "back outside the context: hit again";
  });
}

// A rule that computes on replicated inputs, to see a replaced rule take effect.
class ReplicatedTranspose : public DistributedOp {
 public:
  std::string class_name() const override { return "ReplicatedTranspose"; }
  std::string rule() const override { return "replicate, then transpose locally"; }
  ShardingDecision infer_layout(const OpCall& call) const override {
    const TensorArg& self = call.tensors().at(0);
    const Placements rep(call.mesh().ndim(), Replicate());
    ShardingDecision d;
    d.input_placements = {rep};
    d.output_layouts = {{Layout(call.mesh(), rep, {self.shape[1], self.shape[0]})}};
    return d;
  }
  bool leaves_local_call_alone(const OpCall&, const ShardingDecision&) const override { return true; }
};

using UnaryOp = std::function<at::Tensor(const at::Tensor&)>;

// The views of one DTensor that have memoised unboxed kernels, by name.
std::vector<std::pair<const char*, UnaryOp>> view_ops() {
  return {
      {"transpose", [](const at::Tensor& x) { return x.transpose(0, 1); }},
      {"t", [](const at::Tensor& x) { return x.t(); }},
      {"permute",
       [](const at::Tensor& x) {
         return x.permute({1, 0});
       }},
      {"unsqueeze", [](const at::Tensor& x) { return x.unsqueeze(1); }},
      {"squeeze", [](const at::Tensor& x) { return x.unsqueeze(0).squeeze(0); }},
  };
}

// The unboxed kernels of single-DTensor reductions and views memoise the output layout per
// input layout: a repeated call is a cache hit, its values are one process's, a mean over a
// sharded dim (rescaled after the local op) and a rule that moves its input still take the
// general path, and a replaced rule is seen at once.
TEST(LayoutCache, MemoServesReductionsAndViewsExactlyAndSeesARuleChange) {
  run_ranks(3, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {3});
    const at::Tensor full = random_tensor({5, 7}, 3);
    std::vector<std::pair<const char*, UnaryOp>> ops = {
        {"sum(1)", [](const at::Tensor& x) { return at::sum(x, {1}); }},
        {"sum(0, keepdim)", [](const at::Tensor& x) { return at::sum(x, {0}, true); }},
        {"sum()", [](const at::Tensor& x) { return at::sum(x); }},
        {"mean(0)", [](const at::Tensor& x) { return at::mean(x, {0}); }},
        {"mean(1)", [](const at::Tensor& x) { return at::mean(x, {1}); }},
        {"amax(1)", [](const at::Tensor& x) { return at::amax(x, {1}); }},
        {"amin(0)", [](const at::Tensor& x) { return at::amin(x, {0}); }},
    };
    for (const auto& view : view_ops()) ops.push_back(view);
    for (const Placements& p : {Placements{Shard(0)}, Placements{Shard(1)}, Placements{Replicate()}}) {
      const at::Tensor x = distribute_tensor(full, mesh, p);
      for (const auto& [name, op] : ops) {
        const at::Tensor expected = op(full);
        const at::Tensor first = op(x);
        const int64_t hits = layout_cache_stats().hits;
        const at::Tensor again = op(x);
        EXPECT_GT(layout_cache_stats().hits, hits) << name << " on " << to_string(p);
        for (const at::Tensor& r : {first, again}) {
          EXPECT_TRUE(at::allclose(full_tensor(r), expected, 1e-15, 1e-15)) << name << " on " << to_string(p);
        }
        EXPECT_EQ(layout_of(first), layout_of(again)) << name << " on " << to_string(p);
      }
    }
  });
  // One rank: the registry is the process's, and ranks replacing a rule at different
  // moments would disagree on collectives.
  run_ranks(1, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {1});
    const at::Tensor full = random_tensor({5, 7}, 3);
    const at::Tensor x = distribute_tensor(full, mesh, {Shard(0)});
    EXPECT_EQ(layout_of(x.transpose(0, 1)).placements(), Placements{Shard(1)});
    const DistributedOpPtr saved = find_distributed_op("transpose");
    register_distributed_op("transpose", std::make_shared<ReplicatedTranspose>());
    const at::Tensor moved = x.transpose(0, 1);
    register_distributed_op("transpose", saved);
    EXPECT_EQ(layout_of(moved).placements(), Placements{Replicate()}) << "the replaced rule";
    EXPECT_TRUE(full_tensor(moved).equal(full.t()));
    EXPECT_EQ(layout_of(x.transpose(0, 1)).placements(), Placements{Shard(1)}) << "the rule restored";
  });
}

namespace {

thread_local int64_t ops_dispatched = 0;

// How many ops LibTorch's dispatcher runs on this thread (RecordFunction, the profiler's
// hook: every Dispatcher::call, not the redispatches between keys) while `f` runs.
int64_t ops_dispatched_by(const std::function<void()>& f) {
  const at::CallbackHandle handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
        ++ops_dispatched;
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  const int64_t before = ops_dispatched;
  f();
  at::removeCallback(handle);
  return ops_dispatched - before;
}

}  // namespace

// A view's local piece is remade from the geometry its op made the first time, without a
// trip through LibTorch's dispatcher (fewer ops dispatched the second time): the op's own
// sizes, strides and storage offset, on the piece's storage (a write through the view lands
// in the piece), for contiguous, transposed and offset pieces of one shape alike; a
// conjugate piece takes the op itself every time (its key stands in front of the kernel);
// and a view of a freed piece fails as the op's own does.
TEST(LayoutCache, ViewsRemadeFromRecordedGeometryAreTheOpsOwnViews) {
  run_ranks(2, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2});
    const std::vector<std::pair<const char*, UnaryOp>> views = view_ops();
    const at::Tensor base = random_tensor({7, 9}, 5 + rank);
    const std::vector<std::pair<const char*, at::Tensor>> pieces = {
        {"contiguous", random_tensor({4, 5}, 11 + rank)},
        {"transposed", random_tensor({5, 4}, 13 + rank).t()},
        {"offset", base.narrow(0, 2, 4).narrow(1, 3, 5)},
    };
    for (const auto& named_view : views) {
      const UnaryOp& view = named_view.second;  // (a lambda cannot capture a structured binding in C++17)
      for (const auto& [piece_name, piece] : pieces) {
        SCOPED_TRACE(std::string(named_view.first) + " of a " + piece_name + " piece");
        const at::Tensor x = DTensor::from_local(piece, mesh, {Shard(0)});
        const at::Tensor expected = view(piece);
        at::Tensor first, again;
        const int64_t first_ops = ops_dispatched_by([&] { first = view(x); });
        const int64_t again_ops = ops_dispatched_by([&] { again = view(x); });
        EXPECT_LT(again_ops, first_ops);
        for (const at::Tensor& r : {first, again}) {
          const at::Tensor& local = local_of(r);
          EXPECT_EQ(local.sizes(), expected.sizes());
          EXPECT_EQ(local.strides(), expected.strides());
          EXPECT_EQ(local.storage_offset(), expected.storage_offset());
          EXPECT_TRUE(local.is_alias_of(piece));
          EXPECT_TRUE(local.equal(expected));
        }
      }
    }
    // A write through a remade view lands in the piece.
    const at::Tensor piece = random_tensor({4, 5}, 17 + rank);
    const at::Tensor x = DTensor::from_local(piece, mesh, {Shard(0)});
    const int64_t first_ops = ops_dispatched_by([&] { (void)x.transpose(0, 1); });
    at::Tensor xt;
    ASSERT_LT(ops_dispatched_by([&] { xt = x.transpose(0, 1); }), first_ops);
    local_of(xt).select(0, 2).select(0, 1).fill_(42.0);
    EXPECT_EQ(piece[1][2].item<double>(), 42.0);
    // A conjugate piece: its view keeps the bit and the values.
    const at::Tensor complex_piece = at::complex(random_tensor({4, 5}, 19), random_tensor({4, 5}, 23));
    const at::Tensor conj = DTensor::from_local(complex_piece.conj(), mesh, {Shard(0)});
    ASSERT_TRUE(local_of(conj).is_conj());
    at::Tensor conj_t;
    const int64_t conj_first_ops = ops_dispatched_by([&] { (void)conj.transpose(0, 1); });
    EXPECT_EQ(ops_dispatched_by([&] { conj_t = conj.transpose(0, 1); }), conj_first_ops);
    EXPECT_TRUE(local_of(conj_t).is_conj());
    EXPECT_TRUE(local_of(conj_t).resolve_conj().equal(complex_piece.conj().t().resolve_conj()));
    // A freed piece (storage resized to nothing, as FSDP frees): the view fails as ATen's.
    const at::Tensor freed_piece = random_tensor({4, 5}, 29 + rank);
    const at::Tensor f = DTensor::from_local(freed_piece, mesh, {Shard(0)});
    (void)f.transpose(0, 1);
    freed_piece.storage().set_nbytes(0);
    EXPECT_THROW((void)freed_piece.transpose(0, 1), c10::Error) << "ATen's own view";
    EXPECT_THROW((void)f.transpose(0, 1), c10::Error) << "the remade view";
  });
}

TEST(LayoutCache, ReplacingARuleClearsTheCache) {
  run_ranks(1, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {1});
    at::Tensor a = distribute_tensor(random_tensor({4, 6}, 1), mesh, {Shard(0)});
    at::sum(a, {1});
    EXPECT_GT(layout_cache_stats().size, 0);
    register_distributed_op("sum", find_distributed_op("sum"));
    EXPECT_EQ(layout_cache_stats().size, 0);
  });
}

// prod: a reduction the memo in front of the cache does not serve (sum's unboxed kernel
// would find xs[0] there after the cache dropped it).
TEST(LayoutCache, IsBoundedAndDropsTheLeastRecentlyUsed) {
  const int64_t saved = layout_cache_capacity();
  set_layout_cache_capacity(4);
  run_ranks(1, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {1});
    clear_layout_cache();
    std::vector<at::Tensor> xs;
    for (int64_t n = 1; n <= 6; ++n) xs.push_back(distribute_tensor(random_tensor({n, 3}, 1), mesh, {Shard(0)}));
    for (const auto& x : xs) at::prod(x, 1);
    EXPECT_EQ(layout_cache_stats().size, 4);
    const int64_t misses = layout_cache_stats().misses;
    at::prod(xs[5], 1);  // recent: kept
    EXPECT_EQ(layout_cache_stats().misses, misses);
    at::prod(xs[0], 1);  // oldest: dropped
    EXPECT_EQ(layout_cache_stats().misses, misses + 1);
  });
  set_layout_cache_capacity(saved);
  EXPECT_THROW(set_layout_cache_capacity(-1), c10::Error);
  EXPECT_EQ(layout_cache_capacity(), saved);
}

namespace {

// Calls that went through layout inference (each is a cache hit or a miss).
int64_t inferred_calls() {
  const auto s = layout_cache_stats();
  return s.hits + s.misses;
}

// The cache's counters are the process's: calls are counted on one rank, where no other
// rank's calls interleave; results are checked at 3 ranks (uneven pieces) as well.
TEST(CommonLayoutFastPath, OneLayoutSkipsInferenceAndGivesTheFullResult) {
  for (const int64_t world : {1, 3}) {
    run_ranks(world, [world](int64_t) {
      auto mesh = init_device_mesh("cpu", {world});
      const at::Tensor fa = random_tensor({5, 7}, 1), fb = random_tensor({5, 7}, 2);
      for (const Placements& p : {Placements{Shard(0)}, Placements{Shard(1)}, Placements{Replicate()}}) {
        const at::Tensor a = distribute_tensor(fa, mesh, p), b = distribute_tensor(fb, mesh, p);
        at::Tensor d = b.clone();
        const int64_t before = inferred_calls();
        const at::Tensor sum = a + b, scaled = at::add(a, b, 0.5), prod = a * b, quot = a / b, e = a.exp(),
                         less = a < b, copy = a.clone(), half = a.to(at::kHalf);
        at::Tensor& same = d.add_(a, 2.0);
        d.mul_(3.0);
        if (world == 1) EXPECT_EQ(inferred_calls(), before) << to_string(p) << ": one layout needs no inference";
        for (const at::Tensor* t :
             std::initializer_list<const at::Tensor*>{&sum, &scaled, &prod, &quot, &e, &less, &copy, &half, &d}) {
          EXPECT_EQ(layout_of(*t), layout_of(a)) << to_string(p);
        }
        EXPECT_TRUE(same.is_same(d)) << "in place returns self";
        EXPECT_TRUE(full_tensor(sum).equal(fa + fb));
        EXPECT_TRUE(full_tensor(scaled).equal(at::add(fa, fb, 0.5)));
        EXPECT_TRUE(full_tensor(prod).equal(fa * fb));
        EXPECT_TRUE(full_tensor(quot).equal(fa / fb));
        EXPECT_TRUE(full_tensor(e).equal(fa.exp()));
        EXPECT_TRUE(full_tensor(less).equal(fa < fb));
        EXPECT_TRUE(full_tensor(copy).equal(fa));
        EXPECT_TRUE(full_tensor(half).equal(fa.to(at::kHalf)));
        EXPECT_TRUE(full_tensor(d).equal(at::add(fb, fa, 2.0).mul(3.0)));
      }
    });
  }
}

TEST(CommonLayoutFastPath, EveryOtherCallIsInferredAndStillExact) {
  for (const int64_t world : {1, 3}) {
    run_ranks(world, [world](int64_t) {
      auto mesh = init_device_mesh("cpu", {world});
      auto nested = init_device_mesh("cpu", {world, 1}, {"a", "b"});
      const at::Tensor fa = random_tensor({5, 7}, 1), fb = random_tensor({5, 7}, 2), row = random_tensor({7}, 3);
      const at::Tensor a = distribute_tensor(fa, mesh, {Shard(0)});
      const at::Tensor replicated = distribute_tensor(fb, mesh, {Replicate()});
      FromLocalOptions column_major;  // a layout whose global strides are not contiguous
      column_major.shape = std::vector<int64_t>{5, 7};
      column_major.stride = std::vector<int64_t>{1, 5};
      const at::Tensor ta = DTensor::from_local(fa, mesh, {Replicate()}, column_major);
      const at::Tensor tb = DTensor::from_local(fb, mesh, {Replicate()}, column_major);
      const at::Tensor partial = DTensor::from_local(at::ones({5, 7}), mesh, {Partial()});
      const at::Tensor n1 = distribute_tensor(fa, nested, {Shard(0), Shard(0)});
      const at::Tensor n2 = distribute_tensor(fb, nested, {Shard(0), Shard(0)});
      const at::Tensor r = distribute_tensor(row, mesh, {Replicate()});
      at::Tensor written = a.clone(), scaled = partial.clone();
      struct Case {
        const char* what;
        std::function<at::Tensor()> op;
        at::Tensor expected;
      };
      const std::vector<Case> cases = {
          {"two layouts", [&] { return a + replicated; }, fa + fb},
          {"a plain operand", [&] { return a + fb; }, fa + fb},
          {"not contiguous", [&] { return ta + tb; }, fa + fb},
          {"Partial", [&] { return partial + partial; }, at::full({5, 7}, 2.0 * world)},
          {"nested shards", [&] { return n1 * n2; }, fa * fb},
          {"broadcast", [&] { return a * r; }, fa * row},
          {"in place, two layouts", [&] { return written.add_(replicated); }, fa + fb},
          {"in place, Partial", [&] { return scaled.mul_(2.0); }, at::full({5, 7}, 2.0 * world)},
      };
      for (const auto& c : cases) {
        const int64_t before = inferred_calls();
        const at::Tensor out = c.op();
        if (world == 1) EXPECT_EQ(inferred_calls(), before + 1) << c.what;
        EXPECT_TRUE(full_tensor(out).equal(c.expected)) << c.what;
      }
    });
  }
}

// A subclass of a rule that keeps a common layout, which changes results in finalize():
// it inherits the class, not the promise (RandomOp is such a subclass of SameLayoutOp).
class NegatingPointwiseOp : public PointwiseOp {
 public:
  void finalize(const OpCall&, const ShardingDecision&, const torch::jit::Stack&,
                torch::jit::Stack& local_results) const override {
    local_results[0].toTensor().neg_();
  }
};

TEST(CommonLayoutFastPath, ASubclassDoesNotInheritThePromise) {
  run_ranks(2, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2});
    // The registry is the process's, shared by the rank threads: one changes it while the
    // other waits (two reloading at once each found the other's ops "declared twice").
    auto change_registry = [&](const std::function<void()>& change) {
      mesh.comm(0).barrier();
      if (rank == 0) change();
      mesh.comm(0).barrier();
    };
    const at::Tensor fa = random_tensor({4, 6}, 1);
    const at::Tensor a = distribute_tensor(fa, mesh, {Shard(0)});
    change_registry([] { register_distributed_op("abs", std::make_shared<NegatingPointwiseOp>()); });
    const at::Tensor result = full_tensor(a.abs());
    change_registry([] { reload_distributed_ops(); });
    EXPECT_TRUE(result.equal(fa.abs().neg())) << "the subclass's finalize() was skipped";
    EXPECT_TRUE(full_tensor(a.abs()).equal(fa.abs())) << "the built-in rule again";
    // The same through an unboxed kernel, which memoises its op's fast path: the memo must
    // not outlive the registry change.
    EXPECT_TRUE(full_tensor(a + a).equal(fa + fa));
    change_registry([] { register_distributed_op("add", std::make_shared<NegatingPointwiseOp>()); });
    const at::Tensor added = full_tensor(a + a);
    change_registry([] { reload_distributed_ops(); });
    EXPECT_TRUE(added.equal((fa + fa).neg())) << "the unboxed kernel's memo outlived the registry change";
    EXPECT_TRUE(full_tensor(a + a).equal(fa + fa)) << "the built-in rule again";
  });
}

TEST(CommonLayoutFastPath, GradientsFlowThroughIt) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    const at::Tensor fa = random_tensor({4, 6}, 1, at::kDouble), fb = random_tensor({4, 6}, 2, at::kDouble);
    const at::Tensor a = distribute_tensor(fa.clone().requires_grad_(), mesh, {Shard(1)});
    const at::Tensor b = distribute_tensor(fb.clone().requires_grad_(), mesh, {Shard(1)});
    (a * b + a.exp()).sum().backward();
    EXPECT_TRUE(full_tensor(a.grad()).equal(fb + fa.exp()));
    EXPECT_TRUE(full_tensor(b.grad()).equal(fa));
  });
}

// A rule that refuses every call, naming itself: shows which rule an op resolved to.
class RefusingOp : public DistributedOp {
 public:
  explicit RefusingOp(std::string tag) : tag_(std::move(tag)) {}
  std::string class_name() const override { return "RefusingOp"; }
  std::string rule() const override { return "refuses"; }
  ShardingDecision infer_layout(const OpCall& call) const override {
    TORCH_CHECK(false, "rule ", tag_, " called for ", call.schema().operator_name());
  }

 private:
  std::string tag_;
};

// A rule that overrides finalize() and nothing else about it: the dispatcher must
// call it (plugins that forgot uses_finalize() used to get their finalize() skipped).
class NegatesInFinalizeOp : public DistributedOp {
 public:
  std::string class_name() const override { return "NegatesInFinalizeOp"; }
  std::string rule() const override { return "keeps the layout; finalize() negates the result"; }
  ShardingDecision infer_layout(const OpCall& call) const override {
    ShardingDecision d;
    d.input_placements = {call.first_layout().placements()};
    d.output_layouts = {{call.first_layout()}};
    return d;
  }
  void finalize(const OpCall&, const ShardingDecision&, const torch::jit::Stack&,
                torch::jit::Stack& local_results) const override {
    local_results[0].toTensor().neg_();
  }
};

int64_t thread_count() {
  int64_t n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

}  // namespace

TEST(OpResolution, AnOverloadsOwnRuleServesThatOverloadOnly) {
  run_ranks(1, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {1});
    at::Tensor a = distribute_tensor(random_tensor({4, 6}, 1), mesh, {Shard(0)});
    register_distributed_op("mul.Scalar", std::make_shared<RefusingOp>("mul.Scalar"));
    EXPECT_NE(error_of([&] { (void)(a * 2.0); }).find("rule mul.Scalar called for aten::mul.Scalar"),
              std::string::npos);
    EXPECT_TRUE(full_tensor(a * a).equal(full_tensor(a).square())) << "mul.Tensor keeps the rule of mul";
    // The in-place form of the overload resolves to the functional overload's rule through "mul".
    at::Tensor b = a.clone();
    b.mul_(a);
    EXPECT_TRUE(full_tensor(b).equal(full_tensor(a).square()));
    reload_distributed_ops();
    EXPECT_TRUE(full_tensor(a * 2.0).equal(full_tensor(a) * 2.0)) << "reloading drops the resolution";
  });
}

TEST(OpResolution, APluginRulesFinalizeIsAlwaysCalled) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor a = distribute_tensor(random_tensor({4, 6}, 1), mesh, {Shard(0)});
    register_distributed_op("abs", std::make_shared<NegatesInFinalizeOp>());
    const at::Tensor result = full_tensor(a.abs());
    reload_distributed_ops();
    EXPECT_TRUE(result.equal(full_tensor(a).abs().neg()));
  });
}

TEST(LayoutCache, CachedDecisionsKeepNoProcessGroupAlive) {
  // On this thread, like a user's program: the cache entries outlive the world.
  const int64_t before = thread_count();
  DeviceMesh mesh;
  {
    InitOptions o;
    o.per_thread = true;
    init_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, o);
    mesh = init_device_mesh("cpu", {1}, {"tp"});
    at::Tensor a = distribute_tensor(random_tensor({4, 6}, 1), mesh, {Shard(0)});
    (void)at::exp(a).sum(1);
    EXPECT_GT(layout_cache_stats().size, 0);
    EXPECT_GT(thread_count(), before) << "Gloo runs threads while the world lives";
  }
  destroy_process_group();
  EXPECT_EQ(thread_count(), before) << "a process group (and its Gloo threads) outlived destroy_process_group()";
  EXPECT_GT(layout_cache_stats().size, 0) << "the cached decisions are still there";
  EXPECT_NE(error_of([&] { (void)mesh.comm(0); }).find("was destroyed (destroy_process_group())"), std::string::npos)
      << "a mesh outliving its world says so when it would communicate";
  clear_layout_cache();
}

TEST(ShardingStrategy, CostModelChargesBytesMovedPerRank) {
  const double bytes = 1000;
  auto cost = [&](Placement a, Placement b, int64_t n) { return redistribute_cost_bytes(a, b, bytes, n); };
  EXPECT_EQ(cost(Shard(0), Shard(0), 4), 0);
  EXPECT_EQ(cost(Shard(0), Replicate(), 1), 0) << "one rank moves nothing";
  EXPECT_LT(cost(Replicate(), Shard(0), 4), cost(Shard(0), Replicate(), 4)) << "chunking is local";
  EXPECT_DOUBLE_EQ(cost(Shard(0), Replicate(), 4), 750) << "all-gather: (n-1)/n of the tensor";
  EXPECT_DOUBLE_EQ(cost(Partial(), Replicate(), 4), 1500) << "all-reduce: twice that";
  EXPECT_DOUBLE_EQ(cost(Partial(), Shard(1), 4), 750) << "reduce-scatter";
  EXPECT_LT(cost(Shard(0), Shard(1), 4), cost(Shard(0), Replicate(), 4)) << "all-to-all moves a piece";
  EXPECT_GT(cost(Shard(0), Replicate(), 8), cost(Shard(0), Replicate(), 2)) << "grows with the mesh";
}

TEST(ShardingStrategy, MatmulTakesTheCheapestStrategyPerMeshDim) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    const at::Tensor fa = random_tensor({6, 8}, 1), fb = random_tensor({8, 4}, 2);
    struct Case {
      Placements a, b, out;
    };
    for (const Case& c : {Case{{Shard(1)}, {Shard(0)}, {Partial()}},    // contraction: nothing moves
                          Case{{Shard(0)}, {Replicate()}, {Shard(0)}},  // rows
                          Case{{Replicate()}, {Shard(1)}, {Shard(1)}},  // columns
                          Case{{Replicate()}, {Replicate()}, {Replicate()}}}) {
      at::Tensor r = at::mm(distribute_tensor(fa, mesh, c.a), distribute_tensor(fb, mesh, c.b));
      EXPECT_EQ(placements_of(r), c.out) << to_string(c.a) << " x " << to_string(c.b);
      EXPECT_TRUE(at::allclose(full_tensor(r), at::mm(fa, fb)));
    }
  });
}

TEST(ShardingStrategy, PointwiseFollowsTheOperandThatIsCheaperToKeep) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    const at::Tensor row = random_tensor({1, 64}, 1), big = random_tensor({64, 64}, 2);
    // Following the first operand's shard would move the big tensor (an all-to-all of
    // 32 KiB); following the second gathers the small row (256 B).
    at::Tensor r = at::add(distribute_tensor(row, mesh, {Shard(1)}), distribute_tensor(big, mesh, {Shard(0)}));
    EXPECT_EQ(placements_of(r), Placements{Shard(0)});
    EXPECT_TRUE(at::allclose(full_tensor(r), row + big));
  });
}

}  // namespace op_registry_test
