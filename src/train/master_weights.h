// bfloat16 training with float32 master weights (the mixed-precision scheme of Megatron and
// apex O2): the model's parameters are bfloat16 (forward, backward and their gradients),
// while the optimizer updates float32 copies and keeps float32 state. Without them, AdamW
// steps smaller than a bfloat16 ulp of the weight (2^-8 relative) are rounded away.
//
//   MasterWeights master(model->named_parameters());  // float32 copies, same layouts
//   AdamW opt(master.parameters(), ...);
//   loss.backward();                // bfloat16 gradients on the model
//   master.gradients_to_master();   // float32 .grad on the masters, model's dropped
//   clip_grad_norm_(master.parameters(), ...); opt.step();
//   master.master_to_model();       // rounded (to nearest) into the bfloat16 parameters
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <string>
#include <vector>

namespace hyper_parallel::train {

class MasterWeights {
 public:
  // float32 copies of `model_parameters` (DTensors keep their mesh and placements).
  explicit MasterWeights(const torch::OrderedDict<std::string, at::Tensor>& model_parameters);

  // The float32 leaves the optimizer updates, in the model's parameter order.
  const std::vector<at::Tensor>& parameters() const { return master_; }
  const std::vector<std::string>& names() const { return names_; }

  // Each model parameter's gradient, widened, becomes its master's .grad; the model's
  // are set to none (the next backward starts afresh). A missing gradient stays missing.
  void gradients_to_master();
  // The masters' values, rounded to the model's dtype, into the model's parameters.
  void master_to_model();

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> model_;
  std::vector<at::Tensor> master_;
};

}  // namespace hyper_parallel::train
