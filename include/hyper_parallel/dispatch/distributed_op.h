// DistributedOp: the layout rule of one family of ATen ops (HyperParallel's protocol).
//
//   preprocess   (generic, in OpDispatcher) the call's tensor arguments, their layouts
//                and the static arguments -> an OpCall, from which the cache key is built
//   infer_layout (the family) -> ShardingDecision: the placements each DTensor input
//                must be redistributed to, and the layout of each output. A pure
//                function of the OpCall's key, so the dispatcher caches it.
//   expand       (optional) adjust the local arguments after redistribution
//                (e.g. scale a bias added on every rank of a contracted dim)
//   wrap_output  (generic) wrap local outputs as DTensors with the inferred layouts
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "hyper_parallel/core/layout.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// One tensor argument of the call (tensor lists are flattened, in order).
struct TensorArg {
  size_t arg_index;                  // position in the schema's arguments
  std::optional<size_t> list_index;  // position inside a Tensor[] / Tensor?[] argument
  const Layout* layout;              // nullptr: a plain tensor (treated as replicated)
  c10::IntArrayRef shape;            // global shape (the argument's sizes: valid during the call)
  c10::ScalarType dtype;
};

class OpCall {
 public:
  // `args` are the call's arguments on the dispatcher's stack; `name` must outlive the call.
  OpCall(const c10::OperatorHandle& op, const std::string& name, c10::ArrayRef<c10::IValue> args);

  const c10::OperatorHandle& op() const { return *op_; }
  const std::string& name() const { return *name_; }
  const c10::FunctionSchema& schema() const { return op_->schema(); }
  c10::ArrayRef<c10::IValue> args() const { return args_; }
  const std::vector<TensorArg>& tensors() const { return tensors_; }
  // The DTensor arguments only (indices into tensors()).
  const std::vector<size_t>& dtensor_indices() const { return dtensors_; }
  const DeviceMesh& mesh() const { return mesh_; }

  // Argument by schema name (throws with the schema when absent).
  const c10::IValue& arg(const std::string& name) const;
  bool has_arg(const std::string& name) const;
  // First DTensor argument's layout.
  const Layout& first_layout() const;
  // True for foo_ / foo.out style calls whose output is argument 0 (or `out`).
  bool is_inplace() const;
  bool is_out() const;

 private:
  const c10::OperatorHandle* op_;
  const std::string* name_;
  c10::ArrayRef<c10::IValue> args_;
  std::vector<TensorArg> tensors_;
  std::vector<size_t> dtensors_;
  DeviceMesh mesh_;
};

// What the rule decided.
struct ShardingDecision {
  // Per tensor argument (same order as OpCall::tensors()): target placements;
  // nullopt leaves the argument as it is (plain tensors stay plain).
  std::vector<std::optional<Placements>> input_placements;
  // Per schema return: the output layout(s); empty vector for non-tensor returns.
  // Tensor[] returns have one layout per element.
  std::vector<std::vector<Layout>> output_layouts;
  // Free-form tag a family's expand() reads (part of the cached result).
  int64_t expand_tag = 0;
};

class DistributedOp {
 public:
  virtual ~DistributedOp() = default;
  // The class name as YAML refers to it.
  virtual std::string class_name() const = 0;
  // Short description of the rule for docs/ops.md.
  virtual std::string rule() const = 0;
  virtual ShardingDecision infer_layout(const OpCall& call) const = 0;
  // Called on the local arguments after redistribution, before the local op runs.
  virtual void expand(const OpCall& call, const ShardingDecision& decision, torch::jit::Stack& local_args) const {
    (void)call;
    (void)decision;
    (void)local_args;
  }
  // HyperParallel's wrap_output step: may fix up the local results (e.g. zero the rows
  // of ids another rank owns) before they are wrapped with the inferred layouts.
  // `local_args` are the redistributed local arguments as they were before expand().
  virtual void finalize(const OpCall& call, const ShardingDecision& decision, const torch::jit::Stack& local_args,
                        torch::jit::Stack& local_results) const {
    (void)call;
    (void)decision;
    (void)local_args;
    (void)local_results;
  }
  // True when, with this decision, expand() and finalize() leave the local arguments and
  // results as they are: the local op on the unchanged pieces, its result wrapped in the
  // decision's layout, is then the whole call. The dispatcher then memoises the output
  // layout per input layout for the unboxed kernels of single-DTensor reductions and views.
  // False (never memoised) unless a rule says otherwise.
  virtual bool leaves_local_call_alone(const OpCall& call, const ShardingDecision& decision) const {
    (void)call;
    (void)decision;
    return false;
  }
};

using DistributedOpPtr = std::shared_ptr<const DistributedOp>;

// Parameters of one YAML entry (`__default__` merged in), for a class factory.
// Every key must be read by the factory: a key it does not know is an error that
// names the file and line.
class OpParams {
 public:
  OpParams(std::string op_name, std::string source, std::map<std::string, std::string> values);
  const std::string& op_name() const { return op_name_; }
  // "file.yaml:LINE", for error messages.
  const std::string& source() const { return source_; }
  std::string get(const std::string& key, const std::string& fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::vector<std::string> unread_keys() const;

 private:
  std::string op_name_, source_;
  std::map<std::string, std::string> values_;
  mutable std::set<std::string> read_;
};

using DistributedOpFactory = std::function<DistributedOpPtr(const OpParams&)>;

// Makes a DistributedOp class available to YAML specs under `class_name`.
void register_distributed_op_class(const std::string& class_name, DistributedOpFactory factory);
std::vector<std::string> registered_op_class_names();

// Registers a class next to its definition: HP_REGISTER_OP_CLASS(PointwiseOp, factory).
#define HP_REGISTER_OP_CLASS(NAME, ...)             \
  static const bool hp_op_class_registered_##NAME = \
      (::hyper_parallel::register_distributed_op_class(#NAME, __VA_ARGS__), true)

// input_placements that replicate every DTensor argument and leave plain ones alone.
std::vector<std::optional<Placements>> replicate_dtensor_inputs(const OpCall& call);

// Global shapes of the outputs, computed by running the op on meta tensors with the
// inputs' global shapes. One entry per return; Tensor[] returns give several.
std::vector<std::vector<std::vector<int64_t>>> infer_output_shapes(const OpCall& call);

}  // namespace hyper_parallel

HP_PUBLIC_END
