// training_dtype.h — training.dtype ("float32", "bfloat16", "float64"; validate() refuses
// others) as the ATen type the model's weights and activations are held in.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

namespace hyper_parallel::train {

inline at::ScalarType training_dtype(const std::string& name) {
  if (name == "float64") return at::kDouble;
  if (name == "bfloat16") return at::kBFloat16;
  return at::kFloat;
}

}  // namespace hyper_parallel::train
