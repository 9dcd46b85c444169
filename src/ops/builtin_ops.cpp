// The rules built into the library, registered on first DTensor use.
#include "hyper_parallel/dispatch.h"
#include "ops/pointwise_ops.h"
#include "ops/reduction_ops.h"
#include "ops/tensor_ops.h"
#include "ops/view_ops.h"

namespace hyper_parallel {

void register_builtin_distributed_ops() {
  using L = PointwiseOp::Linearity;
  for (const char* n : {"add", "sub"}) register_distributed_op(n, std::make_shared<PointwiseOp>(L::Additive));
  for (const char* n : {"mul", "div"}) register_distributed_op(n, std::make_shared<PointwiseOp>(L::Multiplicative));
  register_distributed_op("neg", std::make_shared<PointwiseOp>(L::Unary));
  for (const char* n : {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "silu",
                        "pow", "abs", "eq", "ne", "lt", "le", "gt", "ge", "where", "maximum",
                        "minimum", "masked_fill", "threshold_backward", "gelu_backward",
                        "silu_backward", "sigmoid_backward", "tanh_backward", "reciprocal",
                        "clamp", "sin", "cos", "square", "logical_not", "bitwise_not"}) {
    register_distributed_op(n, std::make_shared<PointwiseOp>(L::None));
  }
  register_distributed_op("sum", std::make_shared<ReductionOp>(ReduceOp::Sum, true));
  register_distributed_op("mean", std::make_shared<ReductionOp>(std::nullopt, true));
  register_distributed_op("amax", std::make_shared<ReductionOp>(ReduceOp::Max, false));
  register_distributed_op("amin", std::make_shared<ReductionOp>(ReduceOp::Min, false));
  for (const char* n : {"max", "min", "argmax", "argmin", "prod", "logsumexp"}) {
    register_distributed_op(n, std::make_shared<ReductionOp>(std::nullopt, false));
  }
  for (const char* n : {"view", "_unsafe_view", "_reshape_alias", "squeeze", "unsqueeze", "expand"}) {
    register_distributed_op(n, std::make_shared<ReshapeOp>());
  }
  for (const char* n : {"permute", "transpose", "t"}) register_distributed_op(n, std::make_shared<PermuteOp>());
  for (const char* n : {"select", "slice", "select_backward", "slice_backward"}) {
    register_distributed_op(n, std::make_shared<IndexingViewOp>());
  }
  for (const char* n : {"split", "split_with_sizes", "unbind"}) register_distributed_op(n, std::make_shared<SplitOp>());
  for (const char* n : {"cat", "stack"}) register_distributed_op(n, std::make_shared<ConcatOp>());
  for (const char* n : {"clone", "_to_copy"}) register_distributed_op(n, std::make_shared<SameLayoutOp>(false));
  for (const char* n : {"ones_like", "zeros_like", "empty_like", "full_like", "rand_like",
                        "randn_like", "fill_", "zero_"}) {
    register_distributed_op(n, std::make_shared<SameLayoutOp>(true));
  }
}

}  // namespace hyper_parallel
