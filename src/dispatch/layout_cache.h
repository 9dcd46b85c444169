// LayoutCache: memoised ShardingDecisions (internal).
//
// Key = op identity + for every argument either its layout (DTensor), its shape and dtype
// (plain tensor) or its value (static argument) + the mesh's uid + the thread's context
// token (loss_parallel). Keys are vectors of 64-bit words compared exactly; layouts enter
// in full. One cache per thread (ranks are threads in tests): no lock on the hot path.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "hyper_parallel/distributed_op.h"

namespace hyper_parallel {

struct LayoutCacheKey {
  std::vector<uint64_t> words;
  uint64_t hash = 0;
  // False when an argument cannot be keyed reliably (a tuple, an object ...): the
  // decision is then inferred afresh every time instead of risking a wrong hit.
  bool cacheable = true;
  bool operator==(const LayoutCacheKey& o) const { return hash == o.hash && words == o.words; }
};

// Built into a buffer of the calling thread, valid until its next call.
const LayoutCacheKey& make_layout_cache_key(const OpCall& call);

std::shared_ptr<const ShardingDecision> layout_cache_find(const LayoutCacheKey& key);
// Sets this thread's context token, returning the previous one (loss_parallel guard).
uint64_t exchange_layout_cache_context_token(uint64_t token);

void layout_cache_insert(const LayoutCacheKey& key, std::shared_ptr<const ShardingDecision> d);

}  // namespace hyper_parallel
