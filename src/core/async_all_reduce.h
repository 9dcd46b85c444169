// An all-reduce (sum) that runs while the caller goes on: data-parallel gradient buckets
// are sent as soon as backward has produced them and waited for only at the end.
//
//   PendingAllReduce p = PendingAllReduce::start(comm, flat);  // flat: contiguous
//   ... more backward ...
//   p.wait();  // flat now holds the sum over comm's members
//
// Counted like Communicator's collectives (collective_counts, collective_tally); the
// tally's time is the time spent blocked in wait(), i.e. what overlapping left exposed.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "hyper_parallel/communicator.h"

namespace c10d {
class Work;
}

namespace hyper_parallel {

class PendingAllReduce {
 public:
  PendingAllReduce();
  ~PendingAllReduce();
  PendingAllReduce(PendingAllReduce&&) noexcept;
  PendingAllReduce& operator=(PendingAllReduce&&) noexcept;

  // Starts summing the contiguous `buffer` over comm's members; `buffer` must not be
  // touched until wait() returns. A one-member group finishes at once.
  static PendingAllReduce start(const Communicator& comm, const at::Tensor& buffer);
  // Blocks until the sum is in the buffer (rethrows the backend's error, e.g. a timeout).
  void wait();
  bool pending() const { return static_cast<bool>(work_); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor buffer_;
  const Communicator* comm_ = nullptr;  // names the group when the wait fails; outlives the work
};

}  // namespace hyper_parallel
