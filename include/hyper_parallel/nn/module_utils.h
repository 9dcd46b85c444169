// Helpers to put DTensors into torch::nn modules.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace torch::nn {
class Module;
}

namespace hyper_parallel {

// Replaces the registered parameter `name` of `module` (not of a child) by `value`,
// keeping its requires_grad. torch::nn::Module refuses to re-register a name and keeps
// the table protected; built-in modules also read public members (LinearImpl::weight),
// which the caller must update too, e.g. `linear->weight = module.named_parameters()["weight"]`.
void replace_parameter(torch::nn::Module& module, const std::string& name, const at::Tensor& value);

}  // namespace hyper_parallel

HP_PUBLIC_END
