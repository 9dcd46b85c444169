#include "loss/math/logits_device.h"

#include <c10/util/Exception.h>

namespace hyper_parallel {

void check_on_logits_device(c10::Device logits, c10::Device other, const std::string& what, const std::string& op) {
  TORCH_CHECK(other == logits, op, " under loss_parallel: expected all tensors on the same device, but the ", what,
              " is on ", other, " and the logits on ", logits, " (move the ", what, " with .to(", logits, "))");
}

}  // namespace hyper_parallel
