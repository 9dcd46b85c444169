// The op registry: names, YAML specs, plugins, errors, and the layout cache.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

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

const std::string kData = HP_TEST_DATA_DIR;

}  // namespace

TEST(OpRegistry, OpNamesDropNamespaceAndOverload) {
  auto& d = c10::Dispatcher::singleton();
  EXPECT_EQ(get_op_name(*d.findSchema({"aten::_log_softmax", ""})), "_log_softmax");
  EXPECT_EQ(get_op_name(*d.findSchema({"aten::sum", "dim_IntList"})), "sum");
  EXPECT_EQ(get_op_name(*d.findSchema({"aten::nll_loss_forward", ""})), "nll_loss_forward");
}

TEST(OpRegistry, BuiltInSpecsNameTheirFiles) {
  run_ranks(1, [](int64_t) { init_device_mesh("cpu", {1}); distribute_tensor(at::ones({1}), init_device_mesh("cpu", {1}), {Replicate()}); });
  auto origins = distributed_op_origins();
  ASSERT_TRUE(origins.count("mm"));
  EXPECT_NE(origins["mm"].find("ops/matrix.yaml:"), std::string::npos) << origins["mm"];
  EXPECT_NE(origins["add"].find("ops/pointwise.yaml:"), std::string::npos);
}

TEST(OpRegistry, YamlDirAndPluginAddWorkingOps) {
  RegistryEnv env((kData + "/ops_yaml").c_str(), HP_TEST_PLUGIN_PATH);
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

TEST(OpRegistry, PluginWithoutEntryPointNamesTheSymbol) {
  RegistryEnv env(nullptr, HP_TEST_BAD_PLUGIN_PATH);
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

TEST(LayoutCache, ReplacingARuleClearsTheCache) {
  run_ranks(1, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {1});
    at::Tensor a = distribute_tensor(random_tensor({4, 6}, 1), mesh, {Shard(0)});
    at::exp(a);
    EXPECT_GT(layout_cache_stats().size, 0);
    register_distributed_op("exp", find_distributed_op("exp"));
    EXPECT_EQ(layout_cache_stats().size, 0);
  });
}

TEST(LayoutCache, IsBoundedAndDropsTheLeastRecentlyUsed) {
  const int64_t saved = layout_cache_capacity();
  set_layout_cache_capacity(4);
  run_ranks(1, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {1});
    clear_layout_cache();
    std::vector<at::Tensor> xs;
    for (int64_t n = 1; n <= 6; ++n) xs.push_back(distribute_tensor(random_tensor({n, 3}, 1), mesh, {Shard(0)}));
    for (const auto& x : xs) at::exp(x);
    EXPECT_EQ(layout_cache_stats().size, 4);
    const int64_t misses = layout_cache_stats().misses;
    at::exp(xs[5]);  // recent: kept
    EXPECT_EQ(layout_cache_stats().misses, misses);
    at::exp(xs[0]);  // oldest: dropped
    EXPECT_EQ(layout_cache_stats().misses, misses + 1);
  });
  set_layout_cache_capacity(saved);
  EXPECT_THROW(set_layout_cache_capacity(-1), c10::Error);
  EXPECT_EQ(layout_cache_capacity(), saved);
}
