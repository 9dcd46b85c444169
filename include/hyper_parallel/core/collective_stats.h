// Time and bytes of the collectives this thread has issued (e.g. hp-train's per-phase
// metrics). Unlike CollectiveCounts (which also counts the no-op collectives of
// a one-rank group), this tallies only collectives that went to a process group: their
// number, the bytes each rank sent, and the wall time from issuing to completion (the
// transfer plus any wait for the slowest rank).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// The kinds of collective a Communicator issues (CollectiveCounts' fields, in that order).
enum class CollectiveKind { AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll, Barrier, Scatter };
inline constexpr size_t kCollectiveKinds = 7;
inline constexpr const char* kCollectiveKindNames[kCollectiveKinds] = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier", "scatter"};

struct CollectiveTally {
  int64_t count = 0;
  int64_t bytes = 0;
  double seconds = 0;
  // count and bytes by kind (CollectiveKind's order): what a dry run reports per step.
  std::array<int64_t, kCollectiveKinds> kind_count{};
  std::array<int64_t, kCollectiveKinds> kind_bytes{};
};

// Since this thread started: take differences around a region.
CollectiveTally collective_tally();

}  // namespace hyper_parallel

HP_PUBLIC_END
