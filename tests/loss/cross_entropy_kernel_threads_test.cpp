// The fused cross-entropy CPU kernel runs its rows on the threads LibTorch is given
// (at::set_num_threads): given 2, a call large enough splits its rows between 2 threads, each
// row once, in every dtype, forward and backward, also through loss_parallel on rank threads;
// given 1, or on a call too small to amortise a thread's start (8 x 4000), the calling thread
// alone. Counted, not timed. tests/CMakeLists.txt runs the FusedCrossEntropyKernel suite again
// with each lesser variant forced (ATEN_CPU_CAPABILITY), so every compiled variant is checked.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <regex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "harness/cross_entropy_kernel_args.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"
#include "loss/kernel/cross_entropy_cpu_kernel.h"

namespace cross_entropy_kernel_threads_test {

using namespace hyper_parallel;
using hyper_parallel::testing::backward_args;
using hyper_parallel::testing::forward_args;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

// What the kernel's tasks reported (the observer is a plain function: a global).
struct Tasks {
  std::mutex mu;
  std::set<std::thread::id> threads;
  std::vector<std::pair<int64_t, int64_t>> rows;
};
Tasks* the_tasks = nullptr;

void record_task(int64_t r0, int64_t r1) {
  std::lock_guard<std::mutex> lock(the_tasks->mu);
  the_tasks->threads.insert(std::this_thread::get_id());
  the_tasks->rows.emplace_back(r0, r1);
}

// Records the kernel's tasks while alive, and runs LibTorch on `threads` threads.
class ObservedTasks {
 public:
  explicit ObservedTasks(int threads) : threads_before_(at::get_num_threads()) {
    at::set_num_threads(threads);
    the_tasks = &tasks_;
    ce_kernel::set_row_task_observer(&record_task);
  }
  ~ObservedTasks() {
    ce_kernel::set_row_task_observer(nullptr);
    the_tasks = nullptr;
    at::set_num_threads(threads_before_);
  }
  ObservedTasks(const ObservedTasks&) = delete;
  ObservedTasks& operator=(const ObservedTasks&) = delete;
  size_t threads() const { return tasks_.threads.size(); }
  bool only(std::thread::id thread) const { return tasks_.threads == std::set<std::thread::id>{thread}; }
  // The tasks' rows are [0, rows), each row in exactly one task.
  bool cover_each_row_once(int64_t rows) {
    std::vector<std::pair<int64_t, int64_t>> r = tasks_.rows;
    std::sort(r.begin(), r.end());
    int64_t next = 0;
    for (const auto& [r0, r1] : r) {
      if (r0 != next || r1 <= r0) return false;
      next = r1;
    }
    return next == rows;
  }
  void clear() {
    tasks_.threads.clear();
    tasks_.rows.clear();
  }

 private:
  int threads_before_;
  Tasks tasks_;
};

// One forward_stats and one backward over x [rows, cols] (x's dtype), the gradient over a copy.
void forward_and_backward(const at::Tensor& x, ObservedTasks& seen, int64_t* forward_threads, bool* forward_once) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const at::ScalarType ct = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor stats = at::empty({ce_kernel::kStats, rows}, at::TensorOptions().dtype(ct));
  ce_kernel::forward_stats(forward_args(x, cols, stats));
  *forward_threads = static_cast<int64_t>(seen.threads());
  *forward_once = seen.cover_each_row_once(rows);
  seen.clear();
  const at::Tensor row_max = stats[ce_kernel::kMax].contiguous();
  const at::Tensor log_sum = stats[ce_kernel::kSumExp].log().contiguous();
  const at::Tensor a = at::full({rows}, 1.0 / static_cast<double>(rows), at::TensorOptions().dtype(ct));
  const at::Tensor out = at::empty_like(x);
  ce_kernel::backward(backward_args(x, out, cols, row_max, log_sum, a));
}

#define HP_REQUIRE_PARALLEL_KERNELS() \
  if (const char* why = ce_kernel::serial_rows_reason()) GTEST_SKIP() << why

}  // namespace

TEST(FusedCrossEntropyKernel, GivenTwoThreadsItRunsItsRowsOnTwoInEveryDtype) {
  HP_REQUIRE_PARALLEL_KERNELS();
  const at::Tensor base = random_tensor({256, 4099}, 5) * 3;  // 1 M logits: 16 tasks' worth
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)) + ", " + ce_kernel::capability_name() + " kernel");
    ObservedTasks seen(2);
    int64_t forward_threads = 0;
    bool forward_once = false;
    forward_and_backward(base.to(dtype), seen, &forward_threads, &forward_once);
    EXPECT_EQ(forward_threads, 2) << "forward_stats ran its rows on " << forward_threads << " thread(s)";
    EXPECT_TRUE(forward_once) << "forward_stats' tasks did not cover each row once";
    EXPECT_EQ(seen.threads(), 2u) << "backward ran its rows on " << seen.threads() << " thread(s)";
    EXPECT_TRUE(seen.cover_each_row_once(256)) << "backward's tasks did not cover each row once";
  }
}

TEST(FusedCrossEntropyKernel, GivenOneThreadOrASmallCallItRunsOnTheCallingThread) {
  HP_REQUIRE_PARALLEL_KERNELS();
  // 8 x 4000 (32 K logits) is below one task's grain: no thread is woken for it.
  for (const auto& [threads, rows, cols] : {std::tuple<int, int64_t, int64_t>{1, 256, 4099}, {2, 8, 4000}}) {
    SCOPED_TRACE(std::to_string(threads) + " thread(s), " + std::to_string(rows) + " x " + std::to_string(cols));
    ObservedTasks seen(threads);
    int64_t forward_threads = 0;
    bool forward_once = false;
    forward_and_backward(random_tensor({rows, cols}, 6).to(at::kFloat), seen, &forward_threads, &forward_once);
    EXPECT_EQ(forward_threads, 1);
    EXPECT_TRUE(forward_once);
    EXPECT_TRUE(seen.only(std::this_thread::get_id())) << seen.threads() << " thread(s)";
    EXPECT_TRUE(seen.cover_each_row_once(rows));
  }
}

// The library's own path: loss_parallel's cross_entropy, forward and backward, on a rank
// thread (ranks-as-threads, as the suite runs them), whose thread count LibTorch takes from
// at::set_num_threads on first use.
TEST(FusedCrossEntropyKernel, LossParallelOnARankThreadRunsItsRowsOnTheThreadsGiven) {
  HP_REQUIRE_PARALLEL_KERNELS();
  const at::Tensor logits = (random_tensor({512, 4000}, 7) * 2).to(at::kFloat);
  const at::Tensor target = at::randint(4000, {512}, at::make_generator<at::CPUGeneratorImpl>(8), at::kLong);
  ObservedTasks seen(2);
  run_ranks(1, [&](int64_t) {
    auto mesh = init_device_mesh("cpu", {1}, {"tp"});
    at::Tensor x = DTensor::from_local(logits.clone().requires_grad_(true), mesh, {Shard(1)});
    at::Tensor loss;
    {
      auto guard = loss_parallel();
      loss = F::cross_entropy(x, target);
    }
    loss.backward();
  });
  EXPECT_EQ(seen.threads(), 2u) << "the kernel's forward and backward ran on " << seen.threads() << " thread(s)";
}

// The library's OpenMP code calls the runtime LibTorch loads, not a second one beside it (a second
// pool of threads sized to the machine, not set by at::set_num_threads): after the kernels have
// run on 2 threads, the process has mapped one OpenMP runtime (cmake/aten_parallel_backend.cmake).
TEST(FusedCrossEntropyKernel, TheProcessLoadsOneOpenMpRuntime) {
  std::ifstream maps("/proc/self/maps");
  if (!maps) GTEST_SKIP() << "no /proc/self/maps here (not Linux)";
  {
    ObservedTasks seen(2);
    int64_t forward_threads = 0;
    bool forward_once = false;
    forward_and_backward(random_tensor({256, 4099}, 9).to(at::kFloat), seen, &forward_threads, &forward_once);
  }
  const std::regex runtime(R"((/\S*lib(gomp|iomp5|omp)[-.\w]*\.so[.\d]*)$)");
  std::set<std::string> runtimes;
  for (std::string line; std::getline(maps, line);) {
    std::smatch m;
    if (std::regex_search(line, m, runtime)) runtimes.insert(m[1]);
  }
  std::string names;
  for (const auto& r : runtimes) names += " " + r;
  EXPECT_LE(runtimes.size(), 1u) << "OpenMP runtimes mapped:" << names;
}

}  // namespace cross_entropy_kernel_threads_test
