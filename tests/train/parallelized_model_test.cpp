// The train spec's parallelize (parallelized_model.h): what it returns trains the tensors
// each layout updates — the module's own parameters, bfloat16's float32 masters, FSDP's
// shards — named in the module's parameter order; the weights are loaded after TP and
// before the data-parallel wrapping copies them; the layout it reports.
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <mutex>
#include <string>
#include <vector>

#include "harness/rank_harness.h"
#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/config/parallel_dims.h"
#include "hyper_parallel_train/spec/parallelized_model.h"
#include "hyper_parallel_train/spec/train_spec.h"

namespace parallelized_model_test {

using namespace hyper_parallel;
using namespace hyper_parallel::train;
using hyper_parallel::testing::run_ranks;

namespace {

JobConfig job(int64_t dp, int64_t shard, int64_t tp, const std::string& dtype) {
  JobConfig c;
  c.model.dim = 32;
  c.model.n_layers = 2;
  c.model.n_heads = 2;
  c.model.vocab_size = 64;
  c.model.multiple_of = 16;
  c.model.max_seq_len = 16;
  c.training.dtype = dtype;
  c.parallelism.data_parallel_degree = dp;
  c.parallelism.data_parallel_shard_degree = shard;
  c.parallelism.tensor_parallel_degree = tp;
  return c;
}

at::ScalarType dtype_of(const std::string& name) { return name == "bfloat16" ? at::kBFloat16 : at::kFloat; }

// What one rank sees of the spec's parallelize for `c`.
struct Seen {
  std::vector<std::string> module_names, trained_names;
  bool trains_module_parameters = false;  // the very tensors of the module
  bool fully_sharded = false;
  at::ScalarType trained_dtype = at::kFloat;
  size_t stored = 0, module_parameters = 0;
  bool dtensors_when_loading = false;  // TP was applied before load_weights ran
  int loads = 0;
  std::string layout;
};

Seen parallelize_on_ranks(JobConfig c) {
  const ParallelDims dims = ParallelDims::of(c.parallelism);
  Seen seen;
  std::mutex m;
  run_ranks(dims.world_size(), [&](int64_t rank) {
    JobConfig mine = c;
    const TrainSpec& spec = train_spec(mine.model.name);
    std::shared_ptr<torch::nn::Module> module = spec.build(mine.model);
    as_causal_lm(*module).init_weights(7);
    module->to(dtype_of(mine.training.dtype));
    const ParallelDims::Meshes meshes = dims.build_meshes("cpu");
    Seen s;
    std::unique_ptr<ParallelizedModel> p = spec.parallelize(module, dims, meshes, mine, [&] {
      ++s.loads;
      s.dtensors_when_loading = is_dtensor(module->named_parameters()["layers.0.attention.wq.weight"]);
    });
    for (const auto& q : module->named_parameters()) s.module_names.push_back(q.key());
    const NamedParameters trained = p->named_trained_parameters();
    s.trains_module_parameters = trained.size() == module->parameters().size();
    for (size_t i = 0; i < trained.size(); ++i) {
      s.trained_names.push_back(trained[i].first);
      s.trains_module_parameters = s.trains_module_parameters && trained[i].second.is_same(module->parameters()[i]);
      EXPECT_TRUE(trained[i].second.is_same(p->trained_parameters()[i])) << trained[i].first;
    }
    s.trained_dtype = trained.front().second.scalar_type();
    s.fully_sharded = p->fully_sharded() != nullptr;
    s.stored = p->stored_parameters().size();
    s.module_parameters = module->parameters().size();
    s.layout = p->describe();
    std::lock_guard<std::mutex> lock(m);
    if (rank == 0) seen = s;
  });
  return seen;
}

}  // namespace

TEST(ParallelizedModel, OneProcessFloat32TrainsTheModulesOwnParameters) {
  const Seen s = parallelize_on_ranks(job(1, 1, 1, "float32"));
  EXPECT_TRUE(s.trains_module_parameters);
  EXPECT_EQ(s.trained_names, s.module_names);
  EXPECT_FALSE(s.fully_sharded);
  EXPECT_EQ(s.stored, s.module_parameters);  // nothing beside the module
  EXPECT_EQ(s.loads, 1);
  EXPECT_EQ(s.layout, "DP 1 x TP 1");
}

TEST(ParallelizedModel, Bfloat16TrainsFloat32MastersInTheModulesOrder) {
  const Seen s = parallelize_on_ranks(job(1, 1, 2, "bfloat16"));
  EXPECT_FALSE(s.trains_module_parameters);
  EXPECT_EQ(s.trained_names, s.module_names);
  EXPECT_EQ(s.trained_dtype, at::kFloat);
  EXPECT_EQ(s.stored, 2 * s.module_parameters);  // the bfloat16 parameters and their masters
  EXPECT_TRUE(s.dtensors_when_loading);          // the weights go into the TP pieces
  EXPECT_EQ(s.loads, 1);
  EXPECT_EQ(s.layout, "DP 1 x TP 2");
}

TEST(ParallelizedModel, ReplicasTrainTheModulesParametersThroughTheGradientReducer) {
  const Seen s = parallelize_on_ranks(job(2, 1, 1, "float32"));
  EXPECT_TRUE(s.trains_module_parameters);
  EXPECT_FALSE(s.fully_sharded);
  EXPECT_EQ(s.layout.rfind("DP 2 x TP 1 (", 0), 0u) << s.layout;
  EXPECT_NE(s.layout.find(" gradient buckets)"), std::string::npos) << s.layout;
}

TEST(ParallelizedModel, FsdpTrainsFloat32ShardsInTheModulesOrderNotItsGroupOrder) {
  const Seen s = parallelize_on_ranks(job(1, 2, 2, "bfloat16"));
  EXPECT_TRUE(s.fully_sharded);
  EXPECT_FALSE(s.trains_module_parameters);
  // FSDP's own order puts the root group (embeddings, final norm, head) first.
  EXPECT_EQ(s.trained_names, s.module_names);
  EXPECT_EQ(s.trained_dtype, at::kFloat);
  EXPECT_EQ(s.stored, 2 * s.module_parameters);  // compute buffers and shards
  EXPECT_TRUE(s.dtensors_when_loading);
  EXPECT_EQ(s.layout, "DP 1 x FSDP 2 x TP 2");
}

}  // namespace parallelized_model_test
