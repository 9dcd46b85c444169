// The training step at the limit: no fresh-page faults after the first step,
// gradient clipping without fp64 copies of the gradients, and every collective of a step
// counted in the phase that issued it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <sys/resource.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include "compat/file_system.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/core/cpu_allocator.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel_train/config/job_config.h"
#include "train/optim/optim_utils.h"
#include "train/training_job.h"
#include "hyper_parallel_train/trainer.h"

namespace train_step_test {

using namespace hyper_parallel;
using namespace hyper_parallel::train;
using hyper_parallel::testing::run_ranks;

namespace {

int64_t minor_faults() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_minflt);
}

// The debug model's shape where it matters, a 32000-word vocabulary, at 1024 tokens a
// step: each rank's logits and their gradient are 62.5 MiB, above the largest block glibc
// keeps in its heap (32 MiB), so without our allocator each step maps and faults them in
// afresh.
JobConfig lm_job(const std::string& name, int64_t tp) {
  JobConfig c;
  c.dump_folder =
      compat::join_path(compat::temp_directory(), "hp_train_step_test_" + name + "_" + std::to_string(::getpid()));
  compat::remove_all(c.dump_folder);
  c.model.dim = 64;
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.model.vocab_size = 32000;
  c.model.max_seq_len = 64;
  c.training.batch_size = 16;
  c.training.seq_len = 64;
  c.training.steps = 4;
  c.lr_scheduler.warmup_steps = 1;
  c.parallelism.tensor_parallel_degree = tp;
  c.validation.enable = false;
  c.checkpoint.enable = false;
  c.metrics.enable_plot = false;
  return c;
}

}  // namespace

TEST(CachingCpuAllocator, AFreedLargeBlockIsReusedWithoutFreshPageFaults) {
  install_caching_cpu_allocator();
  ASSERT_TRUE(caching_cpu_allocator_installed());
  const int64_t n = int64_t{8} << 20;  // 32 MiB of float: 8192 pages of 4 KiB
  void* first = nullptr;
  {
    at::Tensor a = at::empty({n});
    a.fill_(1.0f);
    first = a.data_ptr();
  }
  const auto before = caching_cpu_allocator_stats();
  const int64_t faults = minor_faults();
  at::Tensor b = at::empty({n});
  b.fill_(2.0f);
  const int64_t fresh = minor_faults() - faults;
  EXPECT_EQ(b.data_ptr(), first) << "the same block again";
  EXPECT_EQ(caching_cpu_allocator_stats().fresh_blocks, before.fresh_blocks);
  EXPECT_LT(fresh, 64) << "writing 32 MiB of reused memory must not fault its 8192 pages in again";
  EXPECT_FLOAT_EQ(b[n - 1].item<float>(), 2.0f);
}

TEST(CachingCpuAllocator, ItsTensorsCanBeLazilyCloned) {
  // Copy-on-write clones need a "simple" data pointer (context == data), as LibTorch's
  // own allocator gives; a block descriptor as context made at::_lazy_clone throw.
  install_caching_cpu_allocator();
  at::Tensor big = at::arange(int64_t{1} << 20, at::kFloat);  // 4 MiB: one of our blocks
  at::Tensor lazy = big._lazy_clone();
  lazy.add_(1.0f);  // materialises its own copy
  EXPECT_EQ(big[5].item<float>(), 5.0f);
  EXPECT_EQ(lazy[5].item<float>(), 6.0f);
}

TEST(CachingCpuAllocator, SmallRequestsGoToLibTorchsAllocator) {
  install_caching_cpu_allocator();
  const auto before = caching_cpu_allocator_stats();
  at::Tensor small = at::ones({1000});
  EXPECT_EQ(caching_cpu_allocator_stats().large_allocations, before.large_allocations);
  EXPECT_EQ(small.sum().item<float>(), 1000.0f);
}

// oneDNN's bfloat16 matmuls allocate with raw_allocate and free with raw_deallocate (through
// raw_deleter()); that aborted in LibTorch's assert until the allocator gave a raw deleter
// that frees blocks of either origin.
TEST(CachingCpuAllocator, RawAllocationsOfEverySizeAreFreed) {
  install_caching_cpu_allocator();
  c10::Allocator* a = c10::GetAllocator(c10::DeviceType::CPU);
  for (size_t n : {size_t{64}, size_t{100} << 10, size_t{256} << 10, size_t{4} << 20}) {
    void* p = a->raw_allocate(n);
    ASSERT_NE(p, nullptr) << n;
    std::memset(p, 1, n);
    a->raw_deallocate(p);
  }
  // A bfloat16 matmul large enough for oneDNN, as bfloat16 training runs it.
  const at::Tensor x = at::randn({256, 512}).to(at::kBFloat16), w = at::randn({512, 512}).to(at::kBFloat16);
  EXPECT_EQ(at::matmul(x, w).sizes(), (std::vector<int64_t>{256, 512}));
}

TEST(ClipGradNorm, NoFullFp64CopyOfAGradientAndTheExactNorm) {
  // The norm used to be g.to(kDouble).pow(2).sum(): two fp64 copies of every gradient a
  // step, each a fresh multi-MiB allocation (page faults).
  install_caching_cpu_allocator();
  at::Tensor p = at::zeros({1 << 20}).set_requires_grad(true);  // 4 MiB of float
  p.mutable_grad() = at::randn({1 << 20}) * 3;
  const double exact = p.grad().to(at::kDouble).pow(2).sum().item<double>();
  const auto before = caching_cpu_allocator_stats();
  const double norm = clip_grad_norm_({p}, 1e9);
  EXPECT_EQ(caching_cpu_allocator_stats().large_allocations, before.large_allocations)
      << "clipping allocated a gradient-sized buffer";
  EXPECT_NEAR(norm, std::sqrt(exact), 1e-12 * std::sqrt(exact));
  // Chunked accumulation across an uneven tail, and a non-contiguous tensor.
  at::Tensor odd = at::randn({3, 40001}).t();
  EXPECT_NEAR(squared_norm_fp64(odd), odd.to(at::kDouble).pow(2).sum().item<double>(), 1e-12 * odd.numel());
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

// The job's two phases in their order: no step before parallelize, and parallelize once
// (a second one would wrap the parallelized module again).
TEST(TrainingJob, AStepNeedsTheParallelizedJobAndParallelizeRunsOnce) {
  JobConfig c = lm_job("job_order", 1);
  c.model.vocab_size = 256;
  TrainingJob job(c, TrainingJob::Weights::Initialised);
  EXPECT_THAT(
      [&] { job.step_parts(); },
      ::testing::ThrowsMessage<c10::Error>(::testing::HasSubstr("TrainingJob::step_parts: parallelize the job first")));
  int loads = 0;
  job.parallelize([&] { ++loads; });
  EXPECT_EQ(loads, 1);
  EXPECT_NO_THROW(job.step_parts());
  EXPECT_THAT([&] { job.parallelize(nullptr); }, ::testing::ThrowsMessage<c10::Error>(::testing::HasSubstr(
                                                     "TrainingJob::parallelize: the job is parallelized already")));
  EXPECT_EQ(loads, 1);
}

TEST(TrainStep, StepsAfterTheFirstFaultAlmostNoFreshPages) {
  // Without the caching allocator every step faulted its logits, their gradient and the
  // fp64 copies of clipping in afresh: ~30k minor faults a step at this size.
  if (kAddressSanitizer) {
    GTEST_SKIP() << "under ASan every allocation goes through ASan's allocator, which quarantines freed "
                    "memory and faults in shadow pages: the count would measure ASan, not the step";
  }
  std::vector<StepResult> results;
  run_ranks(2, [&](int64_t rank) {
    Trainer t(lm_job("faults", 2));
    std::vector<StepResult> r;
    for (int64_t s = 1; s <= 4; ++s) r.push_back(t.train_step(s));
    if (rank == 0) results = r;
  });
  ASSERT_EQ(results.size(), 4u);
  for (const auto& r : results)
    std::printf("step %lld: %lld minor faults\n", (long long)r.step, (long long)r.minor_faults);
  // Both ranks' threads share this process: the bound is for the two together.
  EXPECT_LT(results[2].minor_faults, 1000);
  EXPECT_LT(results[3].minor_faults, 1000);
}

TEST(TrainStep, EveryCollectiveIsCountedInItsPhase) {
  run_ranks(2, [&](int64_t rank) {
    Trainer t(lm_job("phases", 2));
    t.train_step(1);
    reset_collective_counts();
    const StepResult r = t.train_step(2);
    int64_t counted = 0, bytes = 0;
    for (const auto& p : r.phases) {
      counted += p.collectives;
      bytes += p.collective_bytes;
      EXPECT_GE(p.collective_seconds, 0.0);
      EXPECT_LE(p.collective_seconds, p.seconds + 1e-3);
    }
    EXPECT_EQ(counted, collective_counts().total()) << "rank " << rank << ": a collective outside every phase";
    EXPECT_GT(bytes, 0);
    // 2 layers: the embedding's all-reduce and wo's and w2's per layer.
    EXPECT_EQ(r.phases[0].collectives, 5) << "forward";
    EXPECT_EQ(r.phases[1].collectives, 2) << "loss: the call's record and the statistics' all-gather";
    EXPECT_EQ(r.phases[3].collectives, 1) << "clip: one all-reduce of the sharded squares";
    EXPECT_EQ(r.phases[4].collectives, 0) << "optimizer";
    // q/k/v share one input and w1/w3 another: one all-reduce of the summed Partial input
    // gradients each (not 3 + 2) per layer, and one for the output head's input.
    EXPECT_EQ(r.phases[2].collectives, 5) << "backward";
  });
}

}  // namespace train_step_test
