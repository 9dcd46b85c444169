// The Qwen3 family's blocks and tensor-parallel plan: Llama's, plus the per-head q/k norms.
#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/qwen3.h"

namespace hyper_parallel {

DecoderBlockOptions qwen3_block_options(const LlamaArgs& a) {
  DecoderBlockOptions o = llama_block_options(a);
  o.attention.qk_norm = true;
  return o;
}

Llama qwen3_model(const LlamaArgs& a) { return Llama(a, qwen3_block_options(a)); }

ParallelizePlan qwen3_tp_plan(bool loss_parallel, bool sequence_parallel) {
  DecoderBlockOptions blocks;
  blocks.attention.qk_norm = true;
  return decoder_tp_plan(blocks, loss_parallel, sequence_parallel);
}

void parallelize_qwen3(Llama& model, const DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel,
                       std::optional<int64_t> src_data_rank) {
  parallelize_llama(model, tp_mesh, qwen3_tp_plan(loss_parallel, sequence_parallel), src_data_rank);
}

}  // namespace hyper_parallel
