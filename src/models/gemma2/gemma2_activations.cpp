// What a Gemma 2 block keeps for backward: four RMSNorms (before and after attention and the
// MLP), RoPE attention with its scores soft-capped (tanh keeps its output) and a float32
// softmax, GeGLU.
#include "hyper_parallel/models/gemma2.h"
#include "models/decoder_activations.h"

namespace hyper_parallel {

int64_t gemma2_block_activation_bytes(const Gemma2Args& a, const BlockActivationShape& s) {
  const int64_t heads = a.n_heads / s.tp;
  const int64_t scores = s.rows * heads * s.seq * s.seq;
  const int64_t softcapped_scores = a.attn_logit_softcapping > 0 ? scores * s.element_bytes : 0;
  // Reduced precision: the softmax runs in float32 and keeps that output beside the
  // probabilities cast back (transformers' order).
  const int64_t widened_softmax = s.element_bytes < 4 ? scores * s.widened_bytes : 0;
  return 4 * rms_norm_activation_bytes(s, s.residual_tokens, a.dim) + 2 * linear_input_activation_bytes(s, a.dim) +
         attention_activation_bytes(s, heads, a.resolved_head_dim()) + softcapped_scores + widened_softmax +
         gated_mlp_activation_bytes(s, a.ffn_hidden_dim / s.tp);
}

}  // namespace hyper_parallel
