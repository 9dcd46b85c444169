#include "models/decoder_activations.h"

namespace hyper_parallel {

int64_t rms_norm_activation_bytes(const BlockActivationShape& s, int64_t tokens, int64_t width) {
  return tokens * width * (s.widened_bytes + s.element_bytes);
}

int64_t attention_activation_bytes(const BlockActivationShape& s, int64_t heads, int64_t head_dim) {
  const int64_t head_elems = s.tokens() * head_dim;
  return head_elems * s.element_bytes * (3 * heads + heads) + s.rows * heads * s.seq * s.seq * s.element_bytes +
         s.seq * s.seq;
}

int64_t gated_mlp_activation_bytes(const BlockActivationShape& s, int64_t hidden) {
  return 4 * s.tokens() * hidden * s.element_bytes;
}

int64_t linear_input_activation_bytes(const BlockActivationShape& s, int64_t width) {
  return s.tokens() * width * s.element_bytes;
}

}  // namespace hyper_parallel
