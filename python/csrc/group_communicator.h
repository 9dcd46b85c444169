// What the module's bindings and its registered ops share: the communicator of a
// torch.distributed process group named by a string, and the option structs of the kernels.
#pragma once

#include <Python.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/loss/fused_linear_loss.h"
#include "hyper_parallel/loss/vocab_logprobs.h"
#include "hyper_parallel/loss/vocab_parallel.h"

namespace hyper_parallel_python {

namespace hp = hyper_parallel;

// The communicator of the process group torch.distributed registered under `group_name` (the
// form a torch.library schema can carry), made per call: nothing here keeps a group alive past
// destroy_process_group(). "" is one process (no group).
inline std::unique_ptr<hp::Communicator> communicator(std::string_view group_name) {
  if (group_name.empty()) return nullptr;
  c10::intrusive_ptr<c10d::ProcessGroup> pg = c10d::resolve_process_group(std::string(group_name));
  std::vector<int64_t> ranks(pg->getSize());
  std::iota(ranks.begin(), ranks.end(), 0);
  return std::make_unique<hp::Communicator>(std::move(pg), std::move(ranks));
}

inline std::optional<at::Tensor> defined_or_none(const std::optional<at::Tensor>& t) {
  return t && t->defined() ? t : std::nullopt;
}

// The Python ops' loss arguments as the library's cross-entropy definition.
inline hp::CrossEntropyDefinition definition(int64_t ignore_index, int64_t reduction, double label_smoothing,
                                             double z_loss_weight, double logit_softcap) {
  return hp::CrossEntropyDefinition{hp::LossTerms{.z_loss_weight = z_loss_weight, .logit_softcap = logit_softcap},
                                    ignore_index, reduction, label_smoothing};
}

inline hp::VocabCrossEntropyOptions ce_options(int64_t ignore_index, int64_t reduction, double label_smoothing,
                                               double z_loss_weight, double logit_softcap) {
  hp::VocabCrossEntropyOptions o;
  static_cast<hp::CrossEntropyDefinition&>(o) =
      definition(ignore_index, reduction, label_smoothing, z_loss_weight, logit_softcap);
  return o;
}

inline hp::FusedLinearCrossEntropyOptions linear_options(const std::optional<at::Tensor>& weight, int64_t ignore_index,
                                                         int64_t reduction, double label_smoothing,
                                                         double z_loss_weight, double logit_softcap) {
  hp::FusedLinearCrossEntropyOptions o;
  static_cast<hp::CrossEntropyDefinition&>(o) =
      definition(ignore_index, reduction, label_smoothing, z_loss_weight, logit_softcap);
  if (weight && weight->defined()) o.class_weight = *weight;
  return o;
}

// The Python classes of the library's two errors (hyper_parallel_cpp.LossParallelLayoutError,
// ...UnsupportedError): set by the module's init, raised by the registered ops' kernels,
// which torch's own error handling would otherwise turn into RuntimeError.
struct ErrorTypes {
  PyObject* layout = nullptr;
  PyObject* unsupported = nullptr;
};
inline ErrorTypes& error_types() {
  static ErrorTypes types;
  return types;
}

inline hp::LogprobsOptions logprobs_options(double temperature, bool return_entropy, int64_t ignore_index) {
  hp::LogprobsOptions o;
  o.temperature = temperature;
  o.return_entropy = return_entropy;
  o.ignore_index = ignore_index;
  return o;
}

}  // namespace hyper_parallel_python
