#include "train/optim/master_weights.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "train/parallel/local_piece.h"

namespace hyper_parallel::train {

MasterWeights::MasterWeights(const torch::OrderedDict<std::string, at::Tensor>& model_parameters) {
  at::NoGradGuard no_grad;
  for (const auto& p : model_parameters) {
    names_.push_back(p.key());
    model_.push_back(p.value());
    at::Tensor copy =
        shaped_like(local_or_plain(p.value()).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true), p.value());
    copy.set_requires_grad(p.value().requires_grad());
    master_.push_back(copy);
  }
}

void MasterWeights::accumulate_gradients() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < model_.size(); ++i) {
    const at::Tensor g = model_[i].grad();
    if (!g.defined()) continue;
    const at::Tensor sum = master_[i].grad();
    if (sum.defined()) {
      local_or_plain(sum).add_(local_or_plain(g));  // widened element by element, summed in float32
    } else {
      master_[i].mutable_grad() = shaped_like(local_or_plain(g).to(at::kFloat), master_[i]);
    }
    model_[i].mutable_grad() = at::Tensor();
  }
}

void MasterWeights::master_to_model() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < model_.size(); ++i) {
    at::Tensor dst = local_or_plain(model_[i]);
    dst.copy_(local_or_plain(master_[i]));
  }
}

}  // namespace hyper_parallel::train
