// LayoutCache: memoised ShardingDecisions (internal).
//
// Key = op identity + for every argument either its layout (DTensor), its shape and dtype
// (plain tensor) or its value (static argument) + the mesh's uid + the thread's context
// token (loss_parallel). Keys are vectors of 64-bit words compared exactly; layouts enter
// in full. One cache per thread (ranks are threads in tests): no lock on the hot path.
#pragma once

#include <ATen/core/function_schema.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "dispatch/local_view_geometry.h"
#include "hyper_parallel/dispatch/distributed_op.h"

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

// A first level in front of the cache for the unboxed kernels of single-DTensor ops
// (reductions, views: unboxed_kernels.cpp), which take no stack, OpCall or key: op + the
// input's layout + the other arguments as a few words -> the output layout, or nullopt for
// a call that must take the general path. Direct-mapped per thread (64 slots); valid until
// the next registry change and only under the same context token; a hit counts as a hit
// of the cache; capacity 0 switches it off with the cache.
struct LayoutMemoArgs {
  static constexpr size_t kMaxWords = 8;
  std::array<uint64_t, kMaxWords> words{};
  size_t size = 0;
  bool fits = true;  // false: more words than kMaxWords, not memoised
  void push(uint64_t w) {
    if (size < kMaxWords) {
      words[size++] = w;
    } else {
      fits = false;
    }
  }
  bool operator==(const LayoutMemoArgs& o) const {
    return size == o.size && std::equal(words.begin(), words.begin() + size, o.words.begin());
  }
};

// What the memo keeps per key: the output layout (nullopt: the call takes the general
// path) and, for a view, the geometry its op made of the local piece last.
struct LayoutMemoEntry {
  std::optional<Layout> output;
  LocalViewGeometry view;
};

// The memoised entry for this key on the calling thread; nullptr when not memoised. The
// entry stays the key's until the thread's next memo call.
LayoutMemoEntry* layout_memo_find(const c10::FunctionSchema* op, const Layout& input, const LayoutMemoArgs& args);
// Memoises `output` for the key; the new entry, or nullptr where caching is switched off.
LayoutMemoEntry* layout_memo_insert(const c10::FunctionSchema* op, const Layout& input, const LayoutMemoArgs& args,
                                    std::optional<Layout> output);

}  // namespace hyper_parallel
