// Placements: how one mesh dimension holds a global tensor.
//   Shard(d)      each rank on that mesh dim holds one torch.chunk of tensor dim d
//   Replicate()   each rank holds the whole tensor
//   Partial(op)   each rank holds a partial value; the global value is their reduction
// A Placement is a small value type; Shard dims may be negative until a Layout
// normalises them against the tensor's rank.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

enum class ReduceOp : uint8_t { Sum, Avg, Max, Min };

const char* reduce_op_name(ReduceOp op);

class Placement {
 public:
  enum class Kind : uint8_t { Shard, Replicate, Partial };

  static Placement shard(int64_t dim) { return Placement(Kind::Shard, dim, ReduceOp::Sum); }
  static Placement replicate() { return Placement(Kind::Replicate, 0, ReduceOp::Sum); }
  static Placement partial(ReduceOp op = ReduceOp::Sum) { return Placement(Kind::Partial, 0, op); }

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::Shard; }
  bool is_shard(int64_t dim) const { return kind_ == Kind::Shard && dim_ == dim; }
  bool is_replicate() const { return kind_ == Kind::Replicate; }
  bool is_partial() const { return kind_ == Kind::Partial; }
  // Only meaningful for Shard.
  int64_t dim() const { return dim_; }
  // Only meaningful for Partial.
  ReduceOp reduce_op() const { return op_; }

  // Shard(d) with d normalised into [0, ndim); other placements unchanged.
  Placement normalized(int64_t ndim) const;

  bool operator==(const Placement& o) const {
    return kind_ == o.kind_ && (kind_ != Kind::Shard || dim_ == o.dim_) && (kind_ != Kind::Partial || op_ == o.op_);
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }
  size_t hash() const;
  std::string str() const;

 private:
  Placement(Kind k, int64_t d, ReduceOp op) : kind_(k), op_(op), dim_(d) {}
  Kind kind_;
  ReduceOp op_;
  int64_t dim_;
};

// PyTorch-style spellings: Shard(0), Replicate(), Partial().
inline Placement Shard(int64_t dim) { return Placement::shard(dim); }
inline Placement Replicate() { return Placement::replicate(); }
inline Placement Partial(ReduceOp op = ReduceOp::Sum) { return Placement::partial(op); }

using Placements = std::vector<Placement>;

std::string to_string(const Placements& ps);
std::ostream& operator<<(std::ostream& os, const Placement& p);
std::ostream& operator<<(std::ostream& os, const Placements& ps);

}  // namespace hyper_parallel

HP_PUBLIC_END
