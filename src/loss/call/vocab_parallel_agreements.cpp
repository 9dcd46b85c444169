// vocab_parallel.h's agreements that a front end makes itself: the Python routes decide some
// steps of their call before it (learn the vocabulary, refuse or gather by strictness, refuse
// outside the context), and each such step sends the record the call agreement compares, so
// that the ranks stay in step whatever they decide.
#include "hyper_parallel/loss/vocab_parallel.h"

#include <string>
#include <vector>

#include "loss/call/call_agreement.h"

namespace hyper_parallel {

int64_t learn_vocab_size(const std::string& op, int64_t local_classes, const Communicator* comm,
                         const c10::Device& device) {
  return learn_vocabulary(op, local_classes, comm, device);
}

void agree_on_loss_strictness(const std::string& op, bool strict, const std::vector<const Communicator*>& groups,
                              const c10::Device& device) {
  LossCallRecord call;
  call.op = op;
  call.strict = strict;
  if (groups.size() == 1) {
    agree_on_call(call, groups[0], device);
  } else {
    agree_on_context(call, groups, device);
  }
}

void agree_outside_loss_parallel(const std::string& op, const Communicator* group, const c10::Device& device) {
  LossCallRecord call;
  call.op = op;
  call.context = LossContext::outside;
  agree_on_call(call, group, device);
}

}  // namespace hyper_parallel
