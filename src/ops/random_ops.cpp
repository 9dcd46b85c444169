#include "ops/random_ops.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

#include "dtensor/dtensor_impl.h"

namespace hyper_parallel {

std::string RandomOp::rule() const {
  return "output has self's layout (Partial -> Replicate); the full tensor is drawn from the mesh's "
         "random sequence and each rank keeps its piece";
}

ShardingDecision RandomOp::infer_layout(const OpCall& call) const {
  TORCH_CHECK(call.tensors().size() == 1, call.name(), " (", call.schema().operator_name(),
              ") on DTensors: random ops with tensor parameters are not supported; "
              "expected scalar parameters");
  return SameLayoutOp::infer_layout(call);
}

void RandomOp::finalize(const OpCall& call, const ShardingDecision& decision, const torch::jit::Stack& local_args,
                        torch::jit::Stack& local_results) const {
  const Layout& out = decision.output_layouts.at(0).at(0);
  // This rank's piece of the result (self itself for in-place ops): overwritten below.
  at::Tensor result = local_results.at(0).toTensor();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(call.mesh().next_random_seed());
  at::Tensor full = at::empty(out.shape(), result.options().device(at::kCPU));
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    if (draw_ == "uniform") {
      full.uniform_(0, 1, gen);
    } else if (draw_ == "normal") {
      full.normal_(0, 1, gen);
    } else if (draw_ == "randint") {
      const int64_t low = call.has_arg("low") ? call.arg("low").toInt() : 0;
      full.random_(low, call.arg("high").toInt(), gen);
    } else {
      // The op itself, on the full tensor, with the mesh's generator.
      torch::jit::Stack args = local_args;
      args[0] = full;
      const auto& schema_args = call.schema().arguments();
      bool has_generator = false;
      for (size_t i = 0; i < schema_args.size(); ++i) {
        if (schema_args[i].name() == "generator") {
          args[i] = c10::IValue(gen);
          has_generator = true;
        }
      }
      TORCH_CHECK(has_generator, call.name(), ": RandomOp with draw 'inplace' needs an op that takes a generator");
      call.op().callBoxed(&args);
    }
  }
  result.copy_(local_piece(full, out));
}

HP_REGISTER_OP_CLASS(RandomOp, [](const OpParams& p) {
  std::string draw = p.get("draw", "inplace");
  TORCH_CHECK(draw == "inplace" || draw == "uniform" || draw == "normal" || draw == "randint", p.source(),
              ": RandomOp draw must be inplace, uniform, normal or randint, got '", draw, "'");
  return std::make_shared<RandomOp>(std::move(draw));
});

}  // namespace hyper_parallel
