// The sizes of a decoder-only language model, whatever its family. No LibTorch here: a job's
// configuration (hyper_parallel_train/config/job_config.h) holds them too.
#pragma once

#include <cstdint>

#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// The sizes every decoder has, the one struct that says them: a family's arguments
// (LlamaArgs, Gemma2Args) and a job's [model] keys (ModelConfig) derive from it, and
// CausalLanguageModel::sizes() returns it resolved. Hugging Face names in the comments.
struct DecoderSizes {
  int64_t dim = 256;                 // hidden_size
  int64_t n_layers = 2;              // num_hidden_layers
  int64_t n_heads = 8;               // num_attention_heads
  int64_t n_kv_heads = 0;            // num_key_value_heads; 0: n_heads
  int64_t head_dim = 0;              // head_dim; 0: dim / n_heads
  int64_t vocab_size = 32000;        // vocab_size
  int64_t ffn_hidden_dim = 0;        // intermediate_size; 0: the family's derivation
  int64_t multiple_of = 64;          // rounding of a derived ffn_hidden_dim
  double norm_eps = 1e-5;            // rms_norm_eps
  double rope_theta = 10000.0;       // rope_theta
  int64_t max_seq_len = 512;         // max_position_embeddings
  bool tie_word_embeddings = false;  // the head is the token embedding's parameter

  int64_t resolved_kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : dim / n_heads; }
};

}  // namespace hyper_parallel

HP_PUBLIC_END
