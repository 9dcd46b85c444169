// non_finite_steps.cpp — see non_finite_steps.h.
#include "train/optim/non_finite_steps.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace hyper_parallel::train {
namespace {

std::string value_text(double v) { return std::isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf"; }

}  // namespace

std::string describe_non_finite(double loss, double grad_norm) {
  std::string out;
  if (!std::isfinite(loss)) out = "the loss is " + value_text(loss);
  if (!std::isfinite(grad_norm))
    out += (out.empty() ? "" : " and ") + std::string("the gradient norm is ") + value_text(grad_norm);
  return out;
}

bool NonFiniteSteps::check(int64_t step, double loss, double grad_norm) {
  const std::string what = describe_non_finite(loss, grad_norm);
  if (what.empty()) {
    consecutive_ = 0;
    finite_seen_ = true;
    return false;
  }
  ++consecutive_;
  if (consecutive_ <= max_) {
    ++skipped_;
    return true;
  }
  std::ostringstream os;
  os << "step " << step << ": " << what;
  if (max_ > 0) {
    os << " (" << consecutive_ << " such steps in a row, more than training.max_skipped_steps = " << max_ << ")";
  }
  os << ". Training stopped without applying the step or saving a checkpoint of it (the weights and checkpoints are "
        "those of before it). ";
  if (!finite_seen_) {
    // Before any update the learning rate is not the cause: what the run started from is.
    os << "No step of this run has been finite yet, so the weights it started from may be the cause (non-finite "
          "or huge values in the initial or resumed checkpoint), or the data; ";
  }
  os << "Lower --training.lr (or raise --lr_scheduler.warmup_steps), or pass "
        "--training.max_skipped_steps N to skip up to N such steps in a row";
  throw std::runtime_error(os.str());
}

}  // namespace hyper_parallel::train
