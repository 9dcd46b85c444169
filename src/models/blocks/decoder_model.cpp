// The decoder model shell: modules in the order every family registers them, the forward
// around the blocks, and the registry fields that follow from the shell.
#include "hyper_parallel/models/decoder_model.h"

#include <ATen/ATen.h>

#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/decoder_stack.h"
#include "hyper_parallel/nn/parameters_on_meta.h"

namespace hyper_parallel {

DecoderModelImpl::DecoderModelImpl(DecoderModelParts parts)
    : family_(std::move(parts.family)),
      sizes_(parts.sizes),
      blocks_(std::move(parts.blocks)),
      norm_scale_(parts.norm_scale) {
  const DecoderSizes& s = sizes_;
  tok_embeddings = register_module("tok_embeddings", new_embedding(s.vocab_size, s.dim));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < s.n_layers; ++i) layers->push_back(DecoderBlock(blocks_(i)));
  norm = register_module("norm", RMSNorm(s.dim, s.norm_eps, norm_scale_));
  output = register_module("output", new_linear(s.dim, s.vocab_size));
  // Tied: one parameter for both uses (tie_head_to_embeddings, decoder_stack.h);
  // parallelize_decoder_model points the head at the sharded parameter.
  if (s.tie_word_embeddings) tie_head();
  rope_cos_ = register_buffer("rope_cos", on_meta_when_everything_is(parts.rope_tables.first));
  rope_sin_ = register_buffer("rope_sin", on_meta_when_everything_is(parts.rope_tables.second));
}

at::Tensor DecoderModelImpl::forward(const at::Tensor& tokens) {
  return parallel_forward(output, hidden_states(tokens));
}

at::Tensor DecoderModelImpl::hidden_states(const at::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(1) <= sizes_.max_seq_len, family_,
              ": expected tokens [batch, seq] with seq <= ", sizes_.max_seq_len, ", got ", tokens.sizes());
  if (block_hooks_) block_hooks_->before_forward();
  at::Tensor h = embed(parallel_forward(tok_embeddings, tokens));
  h = run_decoder_blocks<DecoderBlockImpl>(layers, block_hooks_.get(), block_checkpointing_, h, rope_cos_, rope_sin_);
  return parallel_forward(norm, h);
}

void DecoderModelImpl::init_weights(uint64_t seed) {
  init_decoder_weights(*this, seed, sizes_.n_layers, norm_scale_ == NormScale::weight ? 1.0 : 0.0, family_);
}

int64_t DecoderModelImpl::flops_per_token(int64_t seq_len) const {
  return dense_decoder_flops_per_token(*this, tok_embeddings->weight, sizes_.tie_word_embeddings, sizes_.n_layers,
                                       sizes_.n_heads, sizes_.head_dim, seq_len);
}

void DecoderModelImpl::tie_head() {
  TORCH_CHECK(sizes_.tie_word_embeddings, family_, ": tie_head on a model whose args do not tie the head");
  tie_head_to_embeddings(output, tok_embeddings);
}

DecoderModelImpl& as_decoder_model(const torch::nn::Module& module) {
  auto* model = dynamic_cast<DecoderModelImpl*>(const_cast<torch::nn::Module*>(&module));
  TORCH_CHECK(model, "expected a decoder model module, got a ", module.name());
  return *model;
}

void parallelize_decoder_model(DecoderModelImpl& model, const DeviceMesh& tp_mesh, const ParallelizePlan& plan,
                               const std::string& who, std::optional<int64_t> src_data_rank) {
  parallelize_decoder(model, tp_mesh, plan, model.block_options(), who, src_data_rank);
  // Tied: the embeddings' weight is now a Shard(0) DTensor over the vocabulary, exactly the
  // layout ColwiseParallel gives a head's weight (same rows per rank), so the head reads it.
  if (model.sizes().tie_word_embeddings) model.tie_head();
}

ModelFamily decoder_model_family(std::string name, std::string parallelize_name) {
  ModelFamily family;
  family.name = std::move(name);
  family.parallelize = [who = std::move(parallelize_name)](torch::nn::Module& m, const DeviceMesh& mesh,
                                                           bool loss_parallel, bool sequence_parallel) {
    DecoderModelImpl& model = as_decoder_model(m);
    parallelize_decoder_model(model, mesh, decoder_tp_plan(model.block_options(), loss_parallel, sequence_parallel),
                              who, /*src_data_rank=*/std::nullopt);
  };
  family.hf_adapter = [](const torch::nn::Module& m) {
    const DecoderModelImpl& model = as_decoder_model(m);
    const DecoderSizes s = model.sizes();
    return decoder_hf_adapter(model.block_options(), s.n_layers, s.tie_word_embeddings);
  };
  family.block_activation_bytes = [](const torch::nn::Module& m, const BlockActivationShape& shape) {
    return decoder_block_activation_bytes(as_decoder_model(m).block_options(), shape);
  };
  return family;
}

}  // namespace hyper_parallel
