// One loss call: the sequence every loss front end runs before its arithmetic, written once
// (internal).
//
// Every front end (the DTensor route's cross_entropy, nll_loss and log_softmax, the functions on
// local pieces, the fused linear losses, the log-probabilities) makes the same steps, and their
// order decides correctness across ranks: a step out of order deadlocks, or lets a call that
// differs between ranks through. LossCallPlan takes what the front end resolved (its record, where
// its classes are, its checks) and runs them:
//   1. the call's record starts its all-gather (PendingCallAgreement), so that every rank sends
//      the same first collective whatever it decides next;
//   2. an unknown vocabulary is learnt from that record (the members' class counts);
//   3. the input checks run inside an InputAgreement, this rank's torch.chunk piece placed
//      first, so that a refusal on one rank is the same error on every rank;
//   4. a rank that refused swaps its inputs for placeholders that touch nothing, so that it
//      still joins every collective the others make;
// then the front end computes: its math settles agreement() before its first collective sized
// by rows and carries inputs() in its statistics' all-gather.
// A front end with no such all-gather (nll_loss) has the checks' verdict travel in the record
// instead: then the checks run first (a vocabulary they need learnt before them), and the
// record is made from what they resolved.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "loss/call/call_agreement.h"
#include "loss/call/class_sharding.h"
#include "loss/call/input_agreement.h"

namespace hyper_parallel {

// Where a call's classes are, whatever resolved it: a DTensor's class sharding, the group and
// vocabulary a function on local pieces was given (the Python front ends pass what they
// resolved this way), the rows of a head's weight.
struct ClassLayout {
  const Communicator* comm = nullptr;  // the group holding the class pieces (null: one process)
  int64_t local_classes = 0;           // this rank's classes
  int64_t vocab_size = -1;             // the global class count; -1: learnt from the members' counts
  // This rank's first class where the resolver knows it (a DTensor's layout); -1: this rank's
  // torch.chunk piece of vocab_size, checked in the call.
  int64_t offset = -1;
  c10::Device device = c10::kCPU;  // the logits' (or hidden's): where the record travels
};

// The layout of classes a resolver already placed (a DTensor's class sharding, a head's rows).
inline ClassLayout placed_layout(const ClassShard& shard, const c10::Device& device) {
  return ClassLayout{shard.comm, shard.local, shard.total, shard.offset, device};
}

// Where the input checks' verdict travels.
enum class CheckVerdict {
  with_statistics,  // in the front end's statistics all-gather; the record travels while it computes
  in_record,        // in the call's record (a front end with no statistics all-gather)
};

// What a front end hands LossCallPlan.
struct LossCallSteps {
  // The call's record and where its classes are, as the front end resolved them (LossCallPlan
  // writes the layout's vocabulary and class count into the record: they are the same). None:
  // the checks resolve the layout themselves (CheckVerdict::in_record; after_checks gives it).
  std::function<void(LossCallRecord& record, ClassLayout& layout)> describe;
  // This rank's input checks (they may fill the front end's inputs), given this rank's classes
  // as far as they are known then (the vocabulary always); none: nothing to check.
  std::function<void(const ClassShard& shard)> checks;
  // On a refusal: this rank's inputs swapped for ones that touch nothing.
  std::function<void()> placeholders;
  // CheckVerdict::in_record only: what the checks resolved, into the record and layout before
  // the record is sent (on a refusal, what is left of it).
  std::function<void(LossCallRecord& record, ClassLayout& layout)> after_checks;
  // The input meant identical on every rank (hashed under HYPER_PARALLEL_CHECK_REPLICATED=1).
  at::Tensor replicated;
  CheckVerdict verdict = CheckVerdict::with_statistics;
};

class LossCallPlan {
 public:
  // Runs steps 1-4 (the constructor returns once the front end may compute). With
  // CheckVerdict::in_record the record is settled here only where this rank's piece needs the
  // members' counts (a layout without an offset); otherwise by the front end (settle()).
  LossCallPlan(const std::string& op, const LossCallSteps& steps);
  ~LossCallPlan();
  LossCallPlan(const LossCallPlan&) = delete;
  LossCallPlan& operator=(const LossCallPlan&) = delete;

  // This rank's classes: what the front end computes with (on a refusal, its own count of
  // the vocabulary the call knows, so that placeholders fit).
  const ClassShard& shard() const { return shard_; }
  bool refused() const { return inputs_->refused(); }
  // For the statistics' all-gather (CheckVerdict::with_statistics; null otherwise: settled).
  const InputAgreement* inputs() const { return verdict_ == CheckVerdict::with_statistics ? inputs_.get() : nullptr; }
  // The record's agreement, for the math to settle before its first collective sized by rows.
  PendingCallAgreement* agreement() { return agreement_.get(); }
  // Waits for the record and compares it (every rank's class count; see agree_on_call).
  std::vector<int64_t> settle() { return agreement_->settle(); }
  // For a front end that computes its per-row statistics itself: `compute`'s statistics
  // ([ce_kernel::kStats, rows] of `options`; zeros on a refusal, whose placeholders compute
  // nothing), made while the record travels, then the record settled: what goes into the
  // statistics' all-gather (with inputs()).
  at::Tensor statistics(int64_t rows, const at::TensorOptions& options, const std::function<at::Tensor()>& compute);

 private:
  CheckVerdict verdict_;
  ClassShard shard_;
  std::unique_ptr<InputAgreement> inputs_;
  std::unique_ptr<PendingCallAgreement> agreement_;
};

// A call with no inputs to check (log_softmax): the record only, agreed at once. Returns this
// rank's classes (a layout without an offset: its torch.chunk piece, every member's count
// checked on every member).
ClassShard agree_on_loss_call(LossCallRecord record, const ClassLayout& layout);

}  // namespace hyper_parallel
