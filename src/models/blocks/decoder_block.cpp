// One decoder block: norms, attention and the gated MLP around two residual adds.
#include "hyper_parallel/models/decoder_blocks.h"
#include "models/module_input.h"

namespace hyper_parallel {

DecoderBlockImpl::DecoderBlockImpl(const DecoderBlockOptions& o) : options_(o) {
  // Registration order is the parameters' order: checkpoints, the seeded initialisation
  // and the HF names follow it.
  auto norm = [&](const char* name) {
    return register_module(name, RMSNorm(o.attention.dim, o.norm_eps, o.norm_scale));
  };
  attention_norm = norm("attention_norm");
  attention = register_module("attention", GroupedQueryAttention(o.attention));
  if (o.post_norms) post_attention_norm = norm("post_attention_norm");
  ffn_norm = norm("ffn_norm");
  feed_forward = register_module("feed_forward", GatedMlp(o.mlp));
  if (o.post_norms) post_ffn_norm = norm("post_ffn_norm");
}

at::Tensor DecoderBlockImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // Norms through parallel_forward: under sequence parallel they are SequenceParallel and
  // x, h are Shard(1) DTensors (the residual adds stay local to each sequence piece).
  at::Tensor attended = attention->forward(module_input(*attention, parallel_forward(attention_norm, x)), cos, sin);
  if (post_attention_norm) attended = parallel_forward(post_attention_norm, attended);
  const at::Tensor h = x + attended;
  at::Tensor mlp = feed_forward->forward(module_input(*feed_forward, parallel_forward(ffn_norm, h)));
  if (post_ffn_norm) mlp = parallel_forward(post_ffn_norm, mlp);
  return h + mlp;
}

}  // namespace hyper_parallel
