// Collectives that run while the caller goes on: data-parallel gradient buckets are
// summed as soon as backward has produced them, and sharded data parallelism gathers the
// next block's parameters while this one computes. Waited for only when needed.
//
//   PendingCollective p = PendingCollective::start_all_reduce(comm, flat);  // flat: contiguous
//   ... more backward ...
//   p.wait();  // flat now holds the sum over comm's members
//
// Counted like Communicator's collectives (collective_counts, collective_tally); the
// tally's time is the time spent blocked in wait(), i.e. what overlapping left exposed.
// The time from issuing to completion (whether or not anyone waited) is measured too:
// completed_seconds() after wait().
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <memory>

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace c10d {
class Work;
}

namespace hyper_parallel {

class PendingCollective {
 public:
  PendingCollective();
  ~PendingCollective();
  PendingCollective(PendingCollective&&) noexcept;
  PendingCollective& operator=(PendingCollective&&) noexcept;

  // Starts summing the contiguous `buffer` over comm's members; `buffer` must not be
  // touched until wait() returns. A one-member group finishes at once.
  static PendingCollective start_all_reduce(const Communicator& comm, const at::Tensor& buffer);
  // Starts gathering every member's contiguous `send` (the same numel everywhere) into the
  // contiguous `recv` of comm.size() x send.numel() elements, member i's at i * send.numel().
  static PendingCollective start_all_gather(const Communicator& comm, const at::Tensor& send, const at::Tensor& recv);
  // Starts summing the contiguous `send` (comm.size() equal segments) over the members;
  // this member's segment of the sum lands in the contiguous `recv`. `send` may be
  // overwritten (a backend without a native reduce-scatter sums it in place).
  static PendingCollective start_reduce_scatter(const Communicator& comm, const at::Tensor& send,
                                                const at::Tensor& recv);
  // Blocks until the result is in place (rethrows the backend's error, e.g. a timeout).
  void wait();
  bool pending() const { return static_cast<bool>(work_); }
  // From issuing to the backend's completion; 0 for a one-member group. Valid after wait().
  double completed_seconds() const { return completed_seconds_; }

 private:
  enum class Kind { AllReduce, AllGather, ReduceScatter };
  // Records a collective the backend has accepted (issued `at`): tallied, its completion
  // stamped by the backend's future.
  void issued(Kind kind, const Communicator& comm, c10::intrusive_ptr<c10d::Work> work,
              std::chrono::steady_clock::time_point at, at::Tensor send, at::Tensor recv);
  c10::intrusive_ptr<c10d::Work> work_;
  Kind kind_ = Kind::AllReduce;
  at::Tensor send_, recv_;
  bool copy_segment_ = false;           // reduce-scatter emulated by an all-reduce of send_: copy this member's segment
  const Communicator* comm_ = nullptr;  // names the group when the wait fails; outlives the work
  std::chrono::steady_clock::time_point issued_;
  // Stamped by the backend's completion callback (nanoseconds after issued_; -1: not yet).
  std::shared_ptr<std::atomic<int64_t>> completed_ns_;
  double completed_seconds_ = 0;
};

}  // namespace hyper_parallel

HP_PUBLIC_END
