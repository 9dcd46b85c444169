#include "hyper_parallel/core/placement.h"

#include <c10/util/Exception.h>

#include <functional>
#include <sstream>

namespace hyper_parallel {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

Placement Placement::normalized(int64_t ndim) const {
  if (kind_ != Kind::Shard) return *this;
  int64_t d = dim_ < 0 ? dim_ + ndim : dim_;
  TORCH_CHECK_INDEX(d >= 0 && d < ndim, "Shard(", dim_, ") is out of range for a tensor with ", ndim,
                    " dimensions (expected a dim in [", -ndim, ", ", ndim, "))");
  return shard(d);
}

size_t Placement::hash() const {
  size_t h = static_cast<size_t>(kind_) * 0x9e3779b97f4a7c15ULL;
  if (kind_ == Kind::Shard) h ^= std::hash<int64_t>()(dim_) + 0x7f4a7c15 + (h << 6) + (h >> 2);
  if (kind_ == Kind::Partial) h ^= static_cast<size_t>(op_) * 0x100000001b3ULL;
  return h;
}

std::string Placement::str() const {
  switch (kind_) {
    case Kind::Shard:
      return "Shard(" + std::to_string(dim_) + ")";
    case Kind::Replicate:
      return "Replicate()";
    case Kind::Partial:
      return std::string("Partial(") + reduce_op_name(op_) + ")";
  }
  return "?";
}

std::string to_string(const Placements& ps) {
  std::ostringstream os;
  os << ps;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Placement& p) { return os << p.str(); }

std::ostream& operator<<(std::ostream& os, const Placements& ps) {
  os << "[";
  for (size_t i = 0; i < ps.size(); ++i) os << (i ? ", " : "") << ps[i].str();
  return os << "]";
}

}  // namespace hyper_parallel
