// The Qwen3 family's module, blocks and tensor-parallel plan: Llama's blocks with the
// per-head q/k norms (the block's option), in the decoder model shell.
#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/qwen3.h"

namespace hyper_parallel {

DecoderBlockOptions qwen3_block_options(const LlamaArgs& a) {
  DecoderBlockOptions o = llama_block_options(a);
  o.attention.qk_norm = true;
  return o;
}

Qwen3Impl::Qwen3Impl(const LlamaArgs& a)
    : DecoderModelImpl(llama_model_parts("Qwen3", a, qwen3_block_options)), args_(a) {}

Qwen3 qwen3_model(const LlamaArgs& a) { return Qwen3(a); }

ParallelizePlan qwen3_tp_plan(bool loss_parallel, bool sequence_parallel) {
  DecoderBlockOptions blocks;
  blocks.attention.qk_norm = true;
  return decoder_tp_plan(blocks, loss_parallel, sequence_parallel);
}

void parallelize_qwen3(Qwen3& model, const DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel,
                       std::optional<int64_t> src_data_rank) {
  parallelize_decoder_model(*model, tp_mesh, qwen3_tp_plan(loss_parallel, sequence_parallel), "parallelize_qwen3",
                            src_data_rank);
}

}  // namespace hyper_parallel
