#include "dispatch/layout_cache.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <list>
#include <mutex>
#include <unordered_map>

#include "hyper_parallel/dispatch.h"

namespace hyper_parallel {

namespace {

struct KeyHash {
  size_t operator()(const LayoutCacheKey& k) const { return k.hash; }
};

// Least recently used first out: `lru` holds the entries, most recent at the front.
struct Cache {
  using Entry = std::pair<LayoutCacheKey, std::shared_ptr<const ShardingDecision>>;
  std::mutex mutex;
  std::list<Entry> lru;
  std::unordered_map<LayoutCacheKey, std::list<Entry>::iterator, KeyHash> map;
  int64_t capacity = 4096;
  std::atomic<int64_t> hits{0}, misses{0};

  void trim() {
    while (static_cast<int64_t>(lru.size()) > capacity) {
      map.erase(lru.back().first);
      lru.pop_back();
    }
  }
};

Cache& cache() {
  static Cache* c = new Cache();  // leaked: used from static destructors of other TUs
  return *c;
}

thread_local uint64_t tls_context_token = 0;

uint64_t mix(uint64_t h, uint64_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

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

// The groups of every mesh dim and the caller's coordinate: two meshes with the same words
// issue collectives on the same groups. Exact, since a cached decision keeps its meshes
// (and so their groups' addresses) alive.
void add_mesh(std::vector<uint64_t>& w, const DeviceMesh& mesh) {
  if (!mesh.defined()) {
    w.push_back(0);
    return;
  }
  w.push_back(static_cast<uint64_t>(mesh.ndim()));
  for (int64_t k = 0; k < mesh.ndim(); ++k) {
    w.push_back(reinterpret_cast<uintptr_t>(&mesh.comm(k)));
    w.push_back(static_cast<uint64_t>(mesh.coordinate()[k]));
  }
}

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

LayoutCacheKey make_layout_cache_key(const OpCall& call) {
  LayoutCacheKey k;
  auto& w = k.words;
  w.reserve(32);
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
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.map.find(key);
  if (it == c.map.end()) {
    ++c.misses;
    return nullptr;
  }
  ++c.hits;
  c.lru.splice(c.lru.begin(), c.lru, it->second);
  return it->second->second;
}

void layout_cache_insert(const LayoutCacheKey& key, std::shared_ptr<const ShardingDecision> d) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.map.count(key)) return;
  c.lru.emplace_front(key, std::move(d));
  c.map.emplace(key, c.lru.begin());
  c.trim();
}

LayoutCacheStats layout_cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return {c.hits.load(), c.misses.load(), static_cast<int64_t>(c.map.size())};
}

void clear_layout_cache() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.map.clear();
  c.lru.clear();
  c.hits = 0;
  c.misses = 0;
}

void set_layout_cache_capacity(int64_t entries) {
  TORCH_CHECK(entries >= 0, "set_layout_cache_capacity: expected a number of entries >= 0, got ", entries);
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.capacity = entries;
  c.trim();
}

int64_t layout_cache_capacity() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.capacity;
}

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
