// What a Llama (or Qwen3) block keeps for backward: two RMSNorms, RoPE attention, SwiGLU, and
// with qk_norm each head's query and key norms.
#include "hyper_parallel/models/llama.h"
#include "models/decoder_activations.h"

namespace hyper_parallel {

int64_t llama_block_activation_bytes(const LlamaArgs& a, const BlockActivationShape& s) {
  const int64_t heads = a.n_heads / s.tp, kv_heads = a.resolved_kv_heads() / s.tp;
  const int64_t head_dim = a.resolved_head_dim();
  int64_t bytes = 2 * rms_norm_activation_bytes(s, s.residual_tokens, a.dim) +
                  2 * linear_input_activation_bytes(s, a.dim) + attention_activation_bytes(s, heads, head_dim) +
                  gated_mlp_activation_bytes(s, a.hidden_dim() / s.tp);
  if (a.qk_norm) {
    // Every query and key head normalised over head_dim, and its per-head float32 scale:
    // small per row, but head_dim is small too.
    const int64_t head_rows = s.tokens() * (heads + kv_heads);
    bytes += rms_norm_activation_bytes(s, head_rows, head_dim) + head_rows * 4;
  }
  return bytes;
}

}  // namespace hyper_parallel
