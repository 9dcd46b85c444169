#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dispatch/dispatch.h"
#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

std::string get_op_name(const c10::OperatorHandle& op) {
  const std::string& full = op.schema().name();
  const auto pos = full.find("::");
  return pos == std::string::npos ? full : full.substr(pos + 2);
}

OpCall::OpCall(const c10::OperatorHandle& op, const std::string& name, c10::ArrayRef<c10::IValue> args)
    : op_(&op), name_(&name), args_(args) {
  tensors_.reserve(args.size());
  auto add = [&](const at::Tensor& t, size_t arg_index, std::optional<size_t> list_index) {
    if (!t.defined()) return;
    TensorArg ta{arg_index, list_index, nullptr, t.sizes(), t.scalar_type()};
    if (auto* impl = dtensor_impl(t)) {
      ta.layout = &impl->layout();
      if (!mesh_.defined()) {
        mesh_ = ta.layout->mesh();
      } else {
        TORCH_CHECK(ta.layout->mesh() == mesh_, *name_,
                    ": DTensor arguments live on different "
                    "meshes (",
                    mesh_.str(), " and ", ta.layout->mesh().str(), "); expected one mesh");
      }
      dtensors_.push_back(tensors_.size());
    }
    tensors_.push_back(std::move(ta));
  };
  const auto& schema_args = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    // An out= argument is not an operand: the rule infers the functional op's layout and
    // the dispatcher writes the result into `out` in out's own layout (commit_writes).
    if (schema_args[i].is_out()) continue;
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      add(v.toTensor(), i, std::nullopt);
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) add(list.get(j), i, j);
    } else if (v.isList()) {
      auto list = v.toListRef();
      for (size_t j = 0; j < list.size(); ++j) {
        if (list[j].isTensor()) add(list[j].toTensor(), i, j);
      }
    }
  }
}

bool OpCall::has_arg(const std::string& name) const { return schema().argumentIndexWithName(name).has_value(); }

const c10::IValue& OpCall::arg(const std::string& name) const {
  auto idx = schema().argumentIndexWithName(name);
  TORCH_CHECK(idx.has_value(), *name_, ": schema ", schema(), " has no argument '", name, "'");
  return args_[*idx];
}

const Layout& OpCall::first_layout() const {
  TORCH_CHECK(!dtensors_.empty(), *name_, ": no DTensor argument");
  return *tensors_[dtensors_.front()].layout;
}

bool OpCall::is_inplace() const {
  const auto& args = schema().arguments();
  return !args.empty() && args[0].alias_info() && args[0].alias_info()->isWrite() && !args[0].is_out();
}

bool OpCall::is_out() const {
  for (const auto& a : schema().arguments()) {
    if (a.is_out()) return true;
  }
  return false;
}

std::vector<std::optional<Placements>> replicate_dtensor_inputs(const OpCall& call) {
  const Placements rep(call.mesh().ndim(), Placement::replicate());
  std::vector<std::optional<Placements>> out;
  for (const auto& t : call.tensors()) out.push_back(t.layout ? std::optional<Placements>(rep) : std::nullopt);
  return out;
}

std::vector<std::vector<std::vector<int64_t>>> infer_output_shapes(const OpCall& call) {
  torch::jit::Stack meta_args(call.args().begin(), call.args().end());
  auto to_meta = [](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) return t;
    return at::empty_strided(t.sizes(), t.strides(), at::TensorOptions().dtype(t.scalar_type()).device(at::kMeta));
  };
  for (auto& v : meta_args) {
    if (v.isTensor()) {
      v = to_meta(v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      c10::List<at::Tensor> out;
      for (size_t j = 0; j < list.size(); ++j) out.push_back(to_meta(list.get(j)));
      v = out;
    } else if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
      auto list = v.toList();
      c10::List<c10::optional<at::Tensor>> out;
      bool tensors = false;
      for (size_t j = 0; j < list.size(); ++j) {
        c10::IValue e = list.get(j);
        if (e.isTensor()) {
          tensors = true;
          out.push_back(to_meta(e.toTensor()));
        } else {
          out.push_back(c10::nullopt);
        }
      }
      if (tensors) v = out;
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    torch::jit::Stack fallback = meta_args;
    try {
      call.op().callBoxed(&meta_args);
    } catch (const c10::Error& meta_error) {
      // No meta kernel (logsumexp, index_select ...): run on zero-filled CPU tensors that own
      // one element each, expanded to the global shapes (no global-sized input exists).
      for (auto& v : fallback) {
        if (!v.isTensor() || !v.toTensor().defined()) continue;
        const at::Tensor& m = v.toTensor();
        v = at::zeros({1}, at::TensorOptions().dtype(m.scalar_type())).expand(m.sizes());
      }
      try {
        call.op().callBoxed(&fallback);
      } catch (const c10::Error& e) {
        TORCH_CHECK(false, call.name(), ": cannot infer output shapes on meta tensors (",
                    meta_error.what_without_backtrace(), ") nor on expanded CPU tensors (", e.what_without_backtrace(),
                    "); its DistributedOp must compute them itself");
      }
      meta_args = std::move(fallback);
    }
  }
  std::vector<std::vector<std::vector<int64_t>>> shapes;
  for (const auto& r : meta_args) {
    std::vector<std::vector<int64_t>> one;
    if (r.isTensor()) {
      const auto& t = r.toTensor();
      if (t.defined()) one.emplace_back(t.sizes().begin(), t.sizes().end());
    } else if (r.isTensorList()) {
      for (const auto& t : r.toTensorVector()) one.emplace_back(t.sizes().begin(), t.sizes().end());
    }
    shapes.push_back(std::move(one));
  }
  return shapes;
}

}  // namespace hyper_parallel
