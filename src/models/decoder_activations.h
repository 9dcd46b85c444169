// decoder_activations.h — what the blocks' shared pieces keep for backward in eager mode, on
// one rank (block_activations.h's shape): the terms every family's block_activation_bytes is
// made of. Each counts the tensors autograd saves, measured against LibTorch's allocator by
// scripts/check_dry_run_accuracy.sh; small per-row statistics are left out unless said.
#pragma once

#include <cstdint>

#include "hyper_parallel/models/block_activations.h"

namespace hyper_parallel {

// An RMSNorm over `width` channels of `tokens` tokens: its input widened to float32 and its
// normalised output (the weight's product keeps it).
int64_t rms_norm_activation_bytes(const BlockActivationShape& s, int64_t tokens, int64_t width);

// Eager attention over this rank's `heads` query heads of `head_dim`: the contiguous q and
// the k and v the matmuls keep (k and v repeated to every query head), the softmax output
// [rows, heads, seq, seq], the causal mask (bool), the output projection's input. RoPE keeps
// nothing: its cos and sin need no gradient.
int64_t attention_activation_bytes(const BlockActivationShape& s, int64_t heads, int64_t head_dim);

// A gated MLP (SwiGLU, GeGLU) of this rank's `hidden` channels: the activation's input, its
// output, the gate's other factor and the down projection's input (their product).
int64_t gated_mlp_activation_bytes(const BlockActivationShape& s, int64_t hidden);

// A projection's input of `width` channels over the whole sequence (what a linear keeps; the
// sequence-parallel all-gather's output under SP).
int64_t linear_input_activation_bytes(const BlockActivationShape& s, int64_t width);

}  // namespace hyper_parallel
