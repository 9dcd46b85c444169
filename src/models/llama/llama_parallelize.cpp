// The Llama family's tensor-parallel plan (TorchTitan's, decoder_plan.h) and its checks
// against the TP degree.
#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/llama.h"

namespace hyper_parallel {

ParallelizePlan llama_tp_plan(bool loss_parallel, bool sequence_parallel) {
  return decoder_tp_plan(DecoderBlockOptions{}, loss_parallel, sequence_parallel);
}

void parallelize_llama(Llama& model, const DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel,
                       std::optional<int64_t> src_data_rank) {
  parallelize_llama(model, tp_mesh, decoder_tp_plan(model->block_options(), loss_parallel, sequence_parallel),
                    src_data_rank);
}

void parallelize_llama(Llama& model, const DeviceMesh& tp_mesh, const ParallelizePlan& plan,
                       std::optional<int64_t> src_data_rank) {
  parallelize_decoder_model(*model, tp_mesh, plan, "parallelize_llama", src_data_rank);
}

}  // namespace hyper_parallel
