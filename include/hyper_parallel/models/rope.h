// Rotary position embeddings for any decoder family: the cos/sin tables (computed as
// transformers does, or in float64 rounded once) and their application to queries and keys
// in either channel layout. The decoder blocks (decoder_blocks.h) apply them; a family says
// which layout its module keeps (HF_INTEROP: a checkpoint's q/k rows are in rotate-half order).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// Which channels of a head rotate together.
enum class RopeLayout {
  adjacent_pairs,  // (2i, 2i + 1): Llama's and Qwen3's modules (their adapters permute HF's q/k rows)
  rotate_half,     // (i, i + head_dim / 2): transformers' layout (x * cos + rotate_half(x) * sin), Gemma 2's module
};

// llama3 rope scaling (Llama 3.1): the inverse frequencies rescaled by wavelength, as
// transformers' _compute_llama3_parameters.
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct RopeTableOptions {
  int64_t head_dim = 0;  // even
  double theta = 10000.0;
  int64_t max_seq_len = 0;  // the tables' rows
  std::optional<Llama3RopeScaling> llama3_scaling = std::nullopt;
  // Inverse frequencies and angles in float32 step by step as transformers computes them
  // (what a model loaded from a checkpoint needs for long contexts to agree); false: in
  // float64, rounded to float32 once. llama3 scaling always follows transformers.
  bool like_transformers = false;
};

// The tables (cos, sin), each [max_seq_len, head_dim / 2] float32.
std::pair<at::Tensor, at::Tensor> rope_tables(const RopeTableOptions& options);

// x [batch, seq, heads, head_dim] rotated by the tables' first seq rows (cast to x's dtype),
// its channels paired as `layout` says.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout);

}  // namespace hyper_parallel

HP_PUBLIC_END
