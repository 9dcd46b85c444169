// The rules a decoder's sizes obey, in the words of a job's [model] keys: what hp-train's
// job validation asks of a family (ModelFamily::size_errors, tp_size_errors) before anything
// is built; and the one check of what a TP degree asks of them, which parallelizing a model
// (decoder_tp_misfits, decoder_plan.h) words in its own terms. No LibTorch here: a job's
// configuration reads it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyper_parallel/core/export.h"
#include "hyper_parallel/models/decoder_sizes.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// Each violation a message naming the keys: n_kv_heads divides n_heads, dim divisible by
// n_heads unless head_dim is given, an even head size for RoPE.
std::vector<std::string> decoder_size_errors(const DecoderSizes& sizes);
// What a TP degree asks of them: whole query and key/value heads per rank.
std::vector<std::string> decoder_tp_size_errors(const DecoderSizes& sizes, int64_t tp);

// The sizes a TP split divides; 0: not known to the caller (a job's [model] keys leave the
// MLP's hidden size to the family), not checked.
struct DecoderTpShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // 0: n_heads (what n_heads asks)
  int64_t dim = 0;
  int64_t ffn_hidden_dim = 0;
};
// Each size a TP split does not divide, in this order.
enum class DecoderTpMisfit { n_heads, n_kv_heads, widths };
// What `tp` ranks ask of `shape`: whole query heads and key/value heads per rank (when
// n_heads > 0), dim and the MLP's hidden size divisible. Empty: it splits; tp < 1: unchecked.
std::vector<DecoderTpMisfit> decoder_tp_split_misfits(const DecoderTpShape& shape, int64_t tp);

}  // namespace hyper_parallel

HP_PUBLIC_END
