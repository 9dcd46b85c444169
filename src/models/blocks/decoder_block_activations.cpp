// What a decoder block keeps for backward, from its options: two RMSNorms (four with
// post-norms), the projections' inputs, RoPE attention (with q/k norms, soft-capped scores
// and a widened softmax where the options say), the gated MLP.
#include "hyper_parallel/models/decoder_plan.h"
#include "models/decoder_activations.h"

namespace hyper_parallel {

int64_t decoder_block_activation_bytes(const DecoderBlockOptions& block, const BlockActivationShape& s) {
  const AttentionOptions& a = block.attention;
  const int64_t heads = a.n_heads / s.tp, kv_heads = a.n_kv_heads / s.tp;
  const int64_t scores = s.rows * heads * s.seq * s.seq;
  const int64_t norms = block.post_norms ? 4 : 2;
  int64_t bytes = norms * rms_norm_activation_bytes(s, s.residual_tokens, a.dim) +
                  2 * linear_input_activation_bytes(s, a.dim) + attention_activation_bytes(s, heads, a.head_dim) +
                  gated_mlp_activation_bytes(s, block.mlp.hidden_dim / s.tp);
  if (a.qk_norm) {
    // Every query and key head normalised over head_dim, and its per-head float32 scale:
    // small per row, but head_dim is small too.
    const int64_t head_rows = s.tokens() * (heads + kv_heads);
    bytes += rms_norm_activation_bytes(s, head_rows, a.head_dim) + head_rows * 4;
  }
  // tanh keeps its output.
  if (a.score_softcap > 0) bytes += scores * s.element_bytes;
  // Reduced precision: the softmax runs in float32 and keeps that output beside the
  // probabilities cast back (transformers' order).
  if (a.softmax_in_float32 && s.element_bytes < 4) bytes += scores * s.widened_bytes;
  return bytes;
}

}  // namespace hyper_parallel
