// The class axis of loss_parallel's logits (internal): which mesh dim shards the class dim,
// whether the logits must be re-laid out first, the placements of a tensor over their rows, or
// the one error every rank raises. Written once, on neutral values (no ATen), for every front
// end: the C++ DTensor route (loss/call/class_sharding.cpp) calls it directly; Python's routes
// (PyTorch's DTensor, HyperParallel's torch and MindSpore DTensors) through
// libhyper_parallel_kernels' hpk_resolve_class_axis. Each route describes its tensor and passes
// its own words; the decision and the sentences are here.
//
// The contract (PyTorch 2.15's loss_parallel): exactly one mesh dim shards the class dim (the
// tensor-parallel dim, anywhere in the mesh); every other mesh dim is Replicate or a Shard of
// another tensor dim (batch, sequence). Under strict that is what is taken; without, a route
// that can re-lay out takes the nearest contract layout (the class shard kept on the last mesh
// dim that shards it, Partials reduced, the rest gathered). A route whose per-row results are
// replicated (rows_sharded = false) takes more than one mesh dim without strict only, its other
// dims Replicate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hyper_parallel::class_axis {

// A mesh dim's placement: Other is one holding other pieces than torch.chunk's (a strided shard).
enum class Kind : int32_t { Shard = 0, Replicate = 1, Partial = 2, Other = 3 };

struct Placement {
  Kind kind = Kind::Replicate;
  int64_t dim = -1;  // Shard only: the tensor dim, non-negative

  bool is_shard() const { return kind == Kind::Shard; }
  bool operator==(const Placement& o) const { return kind == o.kind && (kind != Kind::Shard || dim == o.dim); }
  bool operator!=(const Placement& o) const { return !(*this == o); }
};
using Placements = std::vector<Placement>;

inline Placement shard(int64_t dim) { return {Kind::Shard, dim}; }
inline Placement replicate() { return {Kind::Replicate, -1}; }

// What a route can do with logits off the contract, and its words for messages.
struct Route {
  bool can_relayout = true;  // it re-lays out the logits (without strict)
  bool rows_sharded = true;  // its per-row results can be sharded along the other mesh dims
  std::string tensor;        // how it names its DTensor: "a DTensor", "a HyperParallel DTensor"
  std::string relax;         // how it spells "not strict": "strict = false", "strict=False"; "" if it has no strictness
};

// The strictness, where the caller has it: Unknown until the decision asks (a route may have the
// ranks agree on it first, a collective worth making only where the answer depends on it).
enum class Strictness : int32_t { Unknown = -1, Relaxed = 0, Strict = 1 };

struct Question {
  bool is_dtensor = true;  // false: a plain tensor (always refused)
  Placements placements;   // one per mesh dim
  int64_t class_dim = 1;
  Route route;
  Strictness strictness = Strictness::Unknown;
  // loss_parallel(mesh = ...), when given: per mesh dim, whether that mesh is the whole mesh or
  // that dim's one-dimensional mesh. Empty: no mesh given.
  std::vector<bool> options_mesh_fits;
  std::string op;            // the op, first word of every message
  std::string found;         // the route's words for the layout found (for a plain tensor its shape, or "")
  std::string options_mesh;  // the route's words for the mesh given
};

enum class Outcome : int32_t { Resolved = 0, NeedsStrictness = 1, LayoutError = 2, UnsupportedError = 3 };

struct Decision {
  Outcome outcome = Outcome::Resolved;
  std::string message;    // the error's, for LayoutError / UnsupportedError
  int64_t mesh_dim = -1;  // Resolved: the mesh dim sharding the class dim
  Placements want;        // Resolved: the contract layout (the found one unless relayout)
  bool relayout = false;  // Resolved: re-lay out the logits to `want` first
  Placements rows;        // Resolved: the placements of a tensor over the logits' rows
};

// The one decision. NeedsStrictness: ask again with the strictness known.
Decision decide(const Question& q);

// reduction 'mean' on logits laid out as q.placements (it reads their count, q.strictness,
// q.route.relax, q.op, q.found): PyTorch's contract takes it on a one-dimensional mesh only, so
// under strict a mesh of more dims is UnsupportedError; without strict the route computes the
// exact global mean (Resolved). NeedsStrictness: ask again with the strictness known.
Decision decide_mean(const Question& q);

// The mesh dims that shard `class_dim`.
std::vector<int64_t> mesh_dims_sharding(const Placements& placements, int64_t class_dim);

// The placements of a tensor over the rows of logits laid out `want` (the target, a per-row
// loss): the class dim's Shard made Replicate, a Shard of a later dim moved down one.
Placements row_placements(const Placements& want, int64_t mesh_dim, int64_t class_dim);

// The layout the route takes, in words: "<tensor> sharded along its class dim 1 on exactly one ...".
std::string expected_layout(const Route& route, int64_t class_dim);

}  // namespace hyper_parallel::class_axis
