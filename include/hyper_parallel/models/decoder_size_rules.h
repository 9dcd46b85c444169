// The rules a decoder's sizes obey, in the words of a job's [model] keys: what hp-train's
// job validation asks of a family (ModelFamily::size_errors, tp_size_errors) before anything
// is built. No LibTorch here: a job's configuration reads it.
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

}  // namespace hyper_parallel

HP_PUBLIC_END
