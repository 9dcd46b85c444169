// The ranks of a loss's group agree on its inputs without a collective of their own.
//
// Each rank runs the input checks locally and turns the outcome into a small record that
// rides along in the fused forward's one all-gather. Every rank then reads every record
// the same way, so an input refused on some ranks only (a "replicated" target that differs
// between ranks) is the same error on every rank, not an error on one rank and a hang in
// the collective on the others. Only that error path costs one more collective (to carry
// the messages). With HYPER_PARALLEL_CHECK_REPLICATED=1 the record also holds a hash of
// the input meant to be replicated (the target, where it is), and ranks where it differs
// are named; inputs that legitimately differ (a probability target's class piece) are not.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <string>

namespace hyper_parallel {

class Communicator;

class InputAgreement {
 public:
  // Values per rank: [refused, the target hash as four 16-bit pieces]. 16-bit pieces are
  // exact in every compute type (float32, float64) the statistics travel in.
  static constexpr int64_t kRecordSize = 5;

  // Runs `checks` on this rank and remembers the outcome. `replicated` is the input the call
  // means to be identical on every rank (class-index targets; a probability target only where
  // it is the whole of them, not this rank's piece; undefined: none): it is hashed when
  // HYPER_PARALLEL_CHECK_REPLICATED=1 and it is a plain or replicated tensor.
  InputAgreement(std::string op, const at::Tensor& replicated, const std::function<void()>& checks);

  bool refused() const { return own_ != nullptr; }
  // Fills this rank's record ([kRecordSize], any floating dtype).
  void write_record(const at::Tensor& record) const;
  // `records` [P, kRecordSize]: every rank's record, the same on every rank. Throws the
  // same error on every rank when any rank refused its inputs (or, when comparing, when the
  // targets differ). Calls one collective on `comm` only when some rank refused; a null
  // `comm` is one rank.
  void settle(const at::Tensor& records, const Communicator* comm) const;

 private:
  std::string op_;
  std::exception_ptr own_;
  std::string message_;
  bool compare_ = false;
  uint64_t target_hash_ = 0;
};

}  // namespace hyper_parallel
