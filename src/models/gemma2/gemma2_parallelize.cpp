// The Gemma 2 family's tensor-parallel plan: the decoder's (decoder_plan.h), whose
// sub-module names Gemma 2's module shares, with its post-norms.
#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/gemma2.h"

namespace hyper_parallel {

ParallelizePlan gemma2_tp_plan(bool loss_parallel, bool sequence_parallel) {
  DecoderBlockOptions blocks;
  blocks.post_norms = true;
  return decoder_tp_plan(blocks, loss_parallel, sequence_parallel);
}

void parallelize_gemma2(Gemma2& model, const DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel,
                        std::optional<int64_t> src_data_rank) {
  // The sizes the checks read are every layer's (only the sliding window differs).
  parallelize_decoder_model(*model, tp_mesh, gemma2_tp_plan(loss_parallel, sequence_parallel), "parallelize_gemma2",
                            src_data_rank);
}

}  // namespace hyper_parallel
