#include "hyper_parallel/nn/module_utils.h"
#include "nn/parameter_table.h"

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
  TORCH_CHECK(slot, "replace_parameter: module ", module.name(), " has no parameter '", name, "'; its parameters are ",
              c10::Join(", ", params.keys()));
  const bool requires_grad = slot->requires_grad();
  *slot = value.detach().set_requires_grad(requires_grad);
}

at::Tensor unregister_parameter(torch::nn::Module& module, const std::string& name) {
  auto& params = module.*ParameterTableAccess::table();
  const auto* slot = params.find(name);
  TORCH_CHECK(slot, "unregister_parameter: module ", module.name(), " has no parameter '", name,
              "'; its parameters are ", c10::Join(", ", params.keys()));
  at::Tensor removed = *slot;
  params.erase(name);
  return removed;
}

bool has_own_parameter(const torch::nn::Module& module, const std::string& name) {
  return module.named_parameters(/*recurse=*/false).contains(name);
}

}  // namespace hyper_parallel
