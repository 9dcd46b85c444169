// bfloat16 training with float32 master weights (the mixed-precision scheme of Megatron and
// apex O2): the model's parameters are bfloat16 (forward, backward and their gradients),
// while the optimizer updates float32 copies and keeps float32 state. Without them, AdamW
// steps smaller than a bfloat16 ulp of the weight (2^-8 relative) are rounded away.
//
//   MasterWeights master(model->named_parameters());  // float32 copies, same layouts
//   AdamW opt(master.parameters(), ...);
//   opt.zero_grad();                // the masters' .grad
//   for each micro-batch:
//     loss.backward();              // bfloat16 gradients on the model
//     master.accumulate_gradients();  // added to the masters' float32 .grad, model's dropped
//   clip_grad_norm_(master.parameters(), ...); opt.step();
//   master.master_to_model();       // rounded (to nearest) into the bfloat16 parameters
//
// Micro-batches accumulate in float32 (Megatron's main_grad): a bfloat16 .grad would round
// each sum to 8 bits. Under data parallelism the reducer does the same with the last
// micro-batch (DataParallelReducer's gradient holders).
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

  // Each model parameter's gradient, widened, is added to its master's .grad (which it
  // becomes when the master has none); the model's are set to none, so the next backward
  // starts afresh. A parameter without a gradient leaves its master's as it is.
  void accumulate_gradients();
  // The masters' values, rounded to the model's dtype, into the model's parameters.
  void master_to_model();

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> model_;
  std::vector<at::Tensor> master_;
};

}  // namespace hyper_parallel::train
