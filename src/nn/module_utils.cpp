#include "hyper_parallel/module_utils.h"

#include <torch/nn/module.h>

namespace hyper_parallel {

namespace {
// A pointer to Module's protected parameter table, taken where access is allowed (in a
// derived class) and usable on any Module.
struct ParameterTableAccess : torch::nn::Module {
  static auto table() { return &ParameterTableAccess::parameters_; }
};
}  // namespace

void replace_parameter(torch::nn::Module& module, const std::string& name, const at::Tensor& value) {
  auto& params = module.*ParameterTableAccess::table();
  auto* slot = params.find(name);
  TORCH_CHECK(slot, "replace_parameter: module ", module.name(), " has no parameter '", name,
              "'; its parameters are ", c10::Join(", ", params.keys()));
  const bool requires_grad = slot->requires_grad();
  *slot = value.detach().set_requires_grad(requires_grad);
}

}  // namespace hyper_parallel
