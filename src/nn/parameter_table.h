// Reaching into torch::nn::Module's protected parameter table (module_utils.cpp), for a
// module that reads another's parameter (a head tied to the embeddings).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace torch::nn {
class Module;
}

namespace hyper_parallel {

// Removes the registered parameter `name` of `module` (not of a child) and returns it:
// LibTorch has no unregister_parameter. A module that reads another's parameter must not
// register it too, or every walk of named_parameters() (optimizer, clipping, checkpoints)
// would count it twice.
at::Tensor unregister_parameter(torch::nn::Module& module, const std::string& name);

// Whether `module` itself (not a child) registers a parameter `name`.
bool has_own_parameter(const torch::nn::Module& module, const std::string& name);

}  // namespace hyper_parallel
