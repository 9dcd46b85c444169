#include "train/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace hyper_parallel::train {

namespace {

LrDecayType decay_type_of(const std::string& name) {
  if (name == "linear") return LrDecayType::linear;
  if (name == "sqrt") return LrDecayType::sqrt;
  if (name == "cosine") return LrDecayType::cosine;
  throw std::invalid_argument("lr_scheduler.decay_type = \"" + name + "\" is not one of linear, sqrt, cosine");
}

double unit_ratio(double v, const char* key) {
  if (!(v >= 0 && v <= 1)) {
    std::ostringstream os;
    os << key << " = " << v << " must be in [0, 1]";
    throw std::invalid_argument(os.str());
  }
  return v;
}

// Python's round(): to the nearest integer, halves to the even one (round(2.5) == 2), which
// is nearbyint in the default rounding mode (std::round would take 2.5 to 3).
int64_t round_half_to_even(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

}  // namespace

WarmupStableDecay::WarmupStableDecay(const LrSchedulerConfig& config, int64_t total_steps)
    : total_(total_steps),
      requested_warmup_(config.warmup_steps),
      type_(decay_type_of(config.decay_type)),
      type_name_(config.decay_type),
      min_factor_(unit_ratio(config.min_lr_factor, "lr_scheduler.min_lr_factor")) {
  if (total_steps < 1) throw std::invalid_argument("training.steps = " + std::to_string(total_steps) + " must be > 0");
  if (config.warmup_steps < 0) {
    throw std::invalid_argument("lr_scheduler.warmup_steps = " + std::to_string(config.warmup_steps) + " must be >= 0");
  }
  const double ratio = unit_ratio(config.decay_ratio, "lr_scheduler.decay_ratio");
  warmup_ = std::min(config.warmup_steps, total_steps);
  decay_ = std::min(round_half_to_even(static_cast<double>(total_steps) * ratio), total_steps - warmup_);
  stable_ = total_steps + 1 - warmup_ - decay_;
}

double WarmupStableDecay::factor(int64_t step) const {
  const int64_t i = step - 1;  // TorchTitan's LambdaLR counts from 0
  if (i < warmup_) return static_cast<double>(i + 1) / static_cast<double>(warmup_);
  if (i < warmup_ + stable_) return 1.0;
  const double progress = static_cast<double>(i + 1 - warmup_ - stable_) / static_cast<double>(decay_);
  double curve = 0;
  switch (type_) {
    case LrDecayType::linear:
      curve = 1.0 - progress;
      break;
    case LrDecayType::sqrt:
      curve = 1.0 - std::sqrt(progress);
      break;
    case LrDecayType::cosine:
      curve = 0.5 * (1.0 + std::cos(M_PI * progress));
      break;
  }
  return min_factor_ + (1.0 - min_factor_) * curve;
}

std::string WarmupStableDecay::describe(double lr) const {
  auto steps = [](int64_t first, int64_t last) {
    return first == last ? "step " + std::to_string(first)
                         : "steps " + std::to_string(first) + "-" + std::to_string(last);
  };
  std::ostringstream os;
  os << "learning rate " << lr;
  if (warmup_ > 0) {
    os << ": warm-up over " << steps(1, warmup_);
    if (warmup_cut()) {
      os << " (lr_scheduler.warmup_steps = " << requested_warmup_ << " cut to training.steps, as TorchTitan does)";
    }
  }
  const int64_t held_to = std::min(total_, warmup_ + stable_);
  if (held_to > warmup_) os << (warmup_ > 0 ? ", held over " : ": held over ") << steps(warmup_ + 1, held_to);
  if (held_to < total_) {
    os << ", " << type_name_ << " decay over " << steps(held_to + 1, total_) << " towards " << min_factor_ << " x lr";
  }
  return os.str();
}

}  // namespace hyper_parallel::train
