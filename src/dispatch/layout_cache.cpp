#include "dispatch/layout_cache.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <list>
#include <mutex>
#include <unordered_map>

#include "dispatch/op_resolution.h"
#include "hyper_parallel/dispatch/dispatch.h"

namespace hyper_parallel {

namespace {

// Looks keys up by their words without building a LayoutCacheKey (no allocation on a hit).
struct KeyView {
  const uint64_t* data;
  size_t size;
  uint64_t hash;
};
struct KeyHash {
  using is_transparent = void;
  size_t operator()(const LayoutCacheKey& k) const { return k.hash; }
  size_t operator()(const KeyView& k) const { return k.hash; }
};
struct KeyEqual {
  using is_transparent = void;
  static bool same(const uint64_t* a, size_t na, const uint64_t* b, size_t nb) {
    return na == nb && std::memcmp(a, b, na * sizeof(uint64_t)) == 0;
  }
  bool operator()(const LayoutCacheKey& a, const LayoutCacheKey& b) const { return a == b; }
  bool operator()(const KeyView& a, const LayoutCacheKey& b) const {
    return a.hash == b.hash && same(a.data, a.size, b.words.data(), b.words.size());
  }
  bool operator()(const LayoutCacheKey& a, const KeyView& b) const { return (*this)(b, a); }
};

std::atomic<uint64_t> cache_generation{1};  // bumped by clear_layout_cache()
std::atomic<int64_t> capacity_per_thread{4096};

// One thread's cache. Least recently used first out: `lru` holds the entries, most recent
// at the front. The counters are atomics only so that layout_cache_stats() can read them
// from another thread; the owner is their only writer.
struct ThreadCache {
  using Entry = std::pair<LayoutCacheKey, std::shared_ptr<const ShardingDecision>>;
  uint64_t generation = 0;
  std::list<Entry> lru;
  std::unordered_map<LayoutCacheKey, std::list<Entry>::iterator, KeyHash, KeyEqual> map;
  std::atomic<int64_t> hits{0}, misses{0}, size{0};

  ThreadCache();
  ~ThreadCache();

  void drop_if_stale() {
    const uint64_t now = generation_now();
    if (generation == now) return;
    map.clear();
    lru.clear();
    size.store(0, std::memory_order_relaxed);
    generation = now;
  }
  void trim() {
    const int64_t cap = capacity_per_thread.load(std::memory_order_relaxed);
    while (static_cast<int64_t>(lru.size()) > cap) {
      map.erase(lru.back().first);
      lru.pop_back();
    }
    size.store(static_cast<int64_t>(lru.size()), std::memory_order_relaxed);
  }
  static uint64_t generation_now() { return cache_generation.load(std::memory_order_acquire); }
};

// Every live thread cache, for the statistics; counts of exited threads are folded in.
struct AllCaches {
  std::mutex mutex;
  std::vector<ThreadCache*> live;
  int64_t exited_hits = 0, exited_misses = 0;
};
AllCaches& all_caches() {
  static AllCaches* a = new AllCaches();  // leaked: thread caches outlive static destructors
  return *a;
}

ThreadCache::ThreadCache() {
  std::lock_guard<std::mutex> lock(all_caches().mutex);
  all_caches().live.push_back(this);
}
ThreadCache::~ThreadCache() {
  AllCaches& a = all_caches();
  std::lock_guard<std::mutex> lock(a.mutex);
  a.live.erase(std::find(a.live.begin(), a.live.end(), this));
  a.exited_hits += hits.load();
  a.exited_misses += misses.load();
}

ThreadCache& thread_cache() {
  thread_local ThreadCache c;
  c.drop_if_stale();
  return c;
}

thread_local uint64_t tls_context_token = 0;

uint64_t mix(uint64_t h, uint64_t v) { return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)); }

bool add_ivalue(std::vector<uint64_t>& w, const c10::IValue& v);

void add_scalar(std::vector<uint64_t>& w, const c10::Scalar& s) {
  if (s.isFloatingPoint()) {
    double d = s.toDouble();
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    w.push_back(11);
    w.push_back(bits);
  } else if (s.isBoolean()) {
    w.push_back(12);
    w.push_back(s.toBool());
  } else if (s.isIntegral(false)) {
    w.push_back(13);
    w.push_back(static_cast<uint64_t>(s.toLong()));
  } else {
    w.push_back(14);  // complex: by value of real/imag
    auto c = s.toComplexDouble();
    uint64_t re, im;
    double r = c.real(), i = c.imag();
    std::memcpy(&re, &r, sizeof re);
    std::memcpy(&im, &i, sizeof im);
    w.push_back(re);
    w.push_back(im);
  }
}

void add_tensor(std::vector<uint64_t>& w, const at::Tensor& t) {
  if (!t.defined()) {
    w.push_back(20);
    return;
  }
  if (t.key_set().has(c10::DispatchKey::PrivateUse1)) {
    w.push_back(22);  // a DTensor here; its layout hash follows the arguments
    return;
  }
  w.push_back(21);
  w.push_back(static_cast<uint64_t>(t.scalar_type()));
  w.push_back(static_cast<uint64_t>(t.dim()));
  for (int64_t s : t.sizes()) w.push_back(static_cast<uint64_t>(s));
}

bool add_ivalue(std::vector<uint64_t>& w, const c10::IValue& v) {
  if (v.isNone()) {
    w.push_back(1);
  } else if (v.isTensor()) {
    add_tensor(w, v.toTensor());
  } else if (v.isInt()) {
    w.push_back(2);
    w.push_back(static_cast<uint64_t>(v.toInt()));
  } else if (v.isDouble()) {
    add_scalar(w, c10::Scalar(v.toDouble()));
  } else if (v.isBool()) {
    w.push_back(3);
    w.push_back(v.toBool());
  } else if (v.isScalar()) {
    add_scalar(w, v.toScalar());
  } else if (v.isString()) {
    w.push_back(4);
    w.push_back(std::hash<std::string>()(v.toStringRef()));
  } else if (v.isIntList()) {
    w.push_back(5);
    auto l = v.toIntList();
    w.push_back(l.size());
    for (int64_t x : l) w.push_back(static_cast<uint64_t>(x));
  } else if (v.isList()) {
    auto l = v.toListRef();
    w.push_back(6);
    w.push_back(l.size());
    for (const auto& e : l) {
      if (!add_ivalue(w, e)) return false;
    }
  } else if (v.isDevice()) {
    w.push_back(7);
    w.push_back(static_cast<uint64_t>(v.toDevice().type()) * 1000 + v.toDevice().index() + 1);
  } else if (v.isGenerator()) {
    w.push_back(8);
  } else {
    return false;  // tuples, objects ...: not keyed, never shared
  }
  return true;
}

// The memo's slots. Direct-mapped: a training step's hot (op, layout) pairs are few, and a
// collision costs one decision from the cache behind it.
constexpr size_t kMemoSlots = 64;
struct LayoutMemoSlot {
  const c10::FunctionSchema* op = nullptr;
  uint64_t generation = 0;
  uint64_t token = 0;
  Layout input;
  LayoutMemoArgs args;
  LayoutMemoEntry entry;
};
struct ThreadMemo {
  std::array<LayoutMemoSlot, kMemoSlots> slots;
};
ThreadMemo& thread_memo() {
  thread_local ThreadMemo m;
  return m;
}

// A mesh by its uid: never reused, so equal words mean the same mesh object (same groups,
// same coordinate), and a cached decision need not keep the mesh alive to stay exact.
void add_mesh(std::vector<uint64_t>& w, const DeviceMesh& mesh) { w.push_back(mesh.uid()); }

// A layout in full (mesh, placements, shape, stride), not its hash.
void add_layout(std::vector<uint64_t>& w, const Layout& l) {
  w.push_back(0xD7);
  add_mesh(w, l.mesh());
  w.push_back(l.placements().size());
  for (const auto& p : l.placements()) {
    w.push_back(static_cast<uint64_t>(p.kind()));
    w.push_back(p.is_shard() ? static_cast<uint64_t>(p.dim()) : 0);
    w.push_back(p.is_partial() ? static_cast<uint64_t>(p.reduce_op()) : 0);
  }
  w.push_back(l.shape().size());
  for (int64_t s : l.shape()) w.push_back(static_cast<uint64_t>(s));
  for (int64_t s : l.stride()) w.push_back(static_cast<uint64_t>(s));
}

}  // namespace

const LayoutCacheKey& make_layout_cache_key(const OpCall& call) {
  thread_local LayoutCacheKey k;
  auto& w = k.words;
  w.clear();
  k.cacheable = true;
  w.push_back(reinterpret_cast<uintptr_t>(&call.op().schema()));
  w.push_back(tls_context_token);
  add_mesh(w, call.mesh());
  for (const auto& v : call.args()) k.cacheable = k.cacheable && add_ivalue(w, v);
  for (const auto& t : call.tensors()) {
    if (t.layout) add_layout(w, *t.layout);
  }
  uint64_t h = 0;
  for (uint64_t x : w) h = mix(h, x);
  k.hash = h;
  return k;
}

std::shared_ptr<const ShardingDecision> layout_cache_find(const LayoutCacheKey& key) {
  ThreadCache& c = thread_cache();
  auto it = c.map.find(KeyView{key.words.data(), key.words.size(), key.hash});
  if (it == c.map.end()) {
    c.misses.store(c.misses.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return nullptr;
  }
  c.hits.store(c.hits.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (it->second != c.lru.begin()) c.lru.splice(c.lru.begin(), c.lru, it->second);
  return it->second->second;
}

void layout_cache_insert(const LayoutCacheKey& key, std::shared_ptr<const ShardingDecision> d) {
  ThreadCache& c = thread_cache();
  if (c.map.count(key)) return;
  c.lru.emplace_front(key, std::move(d));
  c.map.emplace(c.lru.front().first, c.lru.begin());
  c.trim();
}

namespace {
LayoutMemoSlot& memo_slot(const c10::FunctionSchema* op, const Layout& input, const LayoutMemoArgs& args) {
  uint64_t h = mix(reinterpret_cast<uintptr_t>(op), input.hash());
  for (size_t i = 0; i < args.size; ++i) h = mix(h, args.words[i]);
  return thread_memo().slots[h % kMemoSlots];
}
}  // namespace

LayoutMemoEntry* layout_memo_find(const c10::FunctionSchema* op, const Layout& input, const LayoutMemoArgs& args) {
  LayoutMemoSlot& slot = memo_slot(op, input, args);
  const bool holds = slot.op == op && slot.generation == op_resolution_generation() &&
                     slot.token == tls_context_token && slot.input == input && slot.args == args &&
                     capacity_per_thread.load(std::memory_order_relaxed) > 0;
  if (!holds) return nullptr;
  ThreadCache& c = thread_cache();
  c.hits.store(c.hits.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return &slot.entry;
}

LayoutMemoEntry* layout_memo_insert(const c10::FunctionSchema* op, const Layout& input, const LayoutMemoArgs& args,
                                    std::optional<Layout> output) {
  if (capacity_per_thread.load(std::memory_order_relaxed) == 0) return nullptr;  // caching switched off
  LayoutMemoSlot& slot = memo_slot(op, input, args);
  slot.op = op;
  slot.generation = op_resolution_generation();
  slot.token = tls_context_token;
  slot.input = input;
  slot.args = args;
  slot.entry = LayoutMemoEntry{std::move(output), {}};
  return &slot.entry;
}

LayoutCacheStats layout_cache_stats() {
  AllCaches& a = all_caches();
  std::lock_guard<std::mutex> lock(a.mutex);
  LayoutCacheStats s{a.exited_hits, a.exited_misses, 0};
  const uint64_t now = ThreadCache::generation_now();
  for (const ThreadCache* c : a.live) {
    s.hits += c->hits.load(std::memory_order_relaxed);
    s.misses += c->misses.load(std::memory_order_relaxed);
    if (c->generation == now) s.size += c->size.load(std::memory_order_relaxed);
  }
  return s;
}

void clear_layout_cache() {
  cache_generation.fetch_add(1, std::memory_order_acq_rel);
  invalidate_op_resolutions();
  // The calling thread's entries go now (they may hold the last handle on a mesh).
  thread_cache();
  thread_memo() = ThreadMemo{};
  AllCaches& a = all_caches();
  std::lock_guard<std::mutex> lock(a.mutex);
  a.exited_hits = a.exited_misses = 0;
  for (ThreadCache* c : a.live) {
    c->hits.store(0, std::memory_order_relaxed);
    c->misses.store(0, std::memory_order_relaxed);
  }
}

void set_layout_cache_capacity(int64_t entries) {
  TORCH_CHECK(entries >= 0, "set_layout_cache_capacity: expected a number of entries >= 0, got ", entries);
  capacity_per_thread.store(entries);
  thread_cache().trim();
}

int64_t layout_cache_capacity() { return capacity_per_thread.load(); }

uint64_t layout_cache_context_token() { return tls_context_token; }

uint64_t exchange_layout_cache_context_token(uint64_t token) {
  std::swap(token, tls_context_token);
  return token;
}

ScopedLayoutCacheToken::ScopedLayoutCacheToken(uint64_t token) : previous_(tls_context_token) {
  tls_context_token = token;
}
ScopedLayoutCacheToken::~ScopedLayoutCacheToken() { tls_context_token = previous_; }

}  // namespace hyper_parallel
