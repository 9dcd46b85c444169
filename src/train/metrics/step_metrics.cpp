#include "train/metrics/step_metrics.h"

#include <sys/resource.h>

#include <ATen/Parallel.h>

#include "hyper_parallel/core/collective_stats.h"
#include "train/metrics/progress.h"

namespace hyper_parallel::train {

namespace {

struct KernelUsage {
  int64_t minor_faults = 0;
  double system_seconds = 0;
};

// This process's minor page faults and kernel CPU time so far (all threads).
KernelUsage kernel_usage() {
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return {};
  return {static_cast<int64_t>(usage.ru_minflt),
          static_cast<double>(usage.ru_stime.tv_sec) + 1e-6 * static_cast<double>(usage.ru_stime.tv_usec)};
}

}  // namespace

void PhaseClock::mark(StepPhaseIndex phase) {
  const auto now = std::chrono::steady_clock::now();
  const CollectiveTally tally = collective_tally();
  StepPhase& p = r_.phases[phase];
  p.seconds += std::chrono::duration<double>(now - start_).count();
  p.collectives += tally.count - collectives_;
  p.collective_bytes += tally.bytes - collective_bytes_;
  p.collective_seconds += tally.seconds - collective_seconds_;
  start_ = now;
  collectives_ = tally.count;
  collective_bytes_ = tally.bytes;
  collective_seconds_ = tally.seconds;
}

void PhaseClock::restart() {
  start_ = std::chrono::steady_clock::now();
  const CollectiveTally tally = collective_tally();
  collectives_ = tally.count;
  collective_bytes_ = tally.bytes;
  collective_seconds_ = tally.seconds;
}

StepMeter::StepMeter() : start_(std::chrono::steady_clock::now()) {
  const KernelUsage usage = kernel_usage();
  minor_faults_ = usage.minor_faults;
  system_seconds_ = usage.system_seconds;
}

void StepMeter::finish(StepResult& r) const {
  const KernelUsage after = kernel_usage();
  r.minor_faults = after.minor_faults - minor_faults_;
  r.system_seconds = after.system_seconds - system_seconds_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

nlohmann::json metrics_record(const StepResult& r, const StepRates& rates, int64_t skipped) {
  nlohmann::json rec = {{"step", r.step},
                        {"loss", r.loss},
                        {"lr", r.lr},
                        {"grad_norm", r.grad_norm},
                        {"skipped", skipped},
                        {"tokens_per_s", rates.tokens_per_s},
                        {"tflops", rates.tflops},
                        {"mfu_pct", rates.mfu_pct},
                        {"peak_memory_mb", peak_memory_mib()},
                        {"step_s", r.seconds},
                        {"minor_faults", r.minor_faults},
                        {"system_s", r.system_seconds},
                        {"intra_op_threads", at::get_num_threads()}};
  int64_t collectives = 0;
  double collective_s = 0;
  for (size_t i = 0; i < kStepPhases; ++i) {
    const StepPhase& p = r.phases[i];
    rec["phases"][kStepPhaseNames[i]] = {{"s", p.seconds},
                                         {"collectives", p.collectives},
                                         {"collective_bytes", p.collective_bytes},
                                         {"collective_s", p.collective_seconds}};
    collectives += p.collectives;
    collective_s += p.collective_seconds;
  }
  rec["collectives"] = collectives;
  rec["collective_s"] = collective_s;
  if (r.val_loss) rec["val_loss"] = *r.val_loss;
  rec["state_bytes"] = {{"parameters", r.state.parameters},
                        {"gradients", r.state.gradients},
                        {"optimizer", r.state.optimizer},
                        {"model_parameters", r.state.model_parameters}};
  if (r.sharding) {
    const ShardingStep& f = *r.sharding;
    rec["fsdp"] = {{"all_gathers", f.all_gathers},   {"reduce_scatters", f.reduce_scatters},
                   {"bytes_sent", f.bytes_sent},     {"collective_s", f.collective_seconds},
                   {"blocked_s", f.blocked_seconds}, {"reduce_dtype", f.reduce_dtype}};
  }
  return rec;
}

}  // namespace hyper_parallel::train
