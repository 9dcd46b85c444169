// Family-neutral decoder blocks: RMSNorm (scaling by w or by 1 + w), grouped-query
// attention with RoPE (optional per-head q/k norms, score scale and soft-cap, sliding
// window, float32 softmax), the gated MLP (SiLU or tanh-GELU), and the block that chains
// them (pre-norms, optionally post-norms too). Llama, Qwen3 and Gemma 2 are built from these;
// a family of its own (in or out of the tree) sets the options its checkpoints describe.
// decoder_plan.h has their TP plan, Hugging Face names and shape checks, decoder_stack.h the
// loop over the blocks, the seeded initialisation and the tied head.
//
// Parallelized sub-modules are called through hp::parallel_forward, so the same code runs on
// one process and under any TP degree; attention works on each rank's local heads
// (ColwiseParallel with use_local_output, as TorchTitan does). Sub-module names are the ones
// the TP plan and the HF names use: attention.{wq,wk,wv,wo,q_norm,k_norm},
// feed_forward.{w1,w2,w3}, attention_norm, post_attention_norm, ffn_norm, post_ffn_norm.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>

#include "hyper_parallel/core/export.h"
#include "hyper_parallel/models/rope.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// How an RMSNorm applies its weight.
enum class NormScale {
  weight,           // x / rms(x) cast to x's dtype, times w (w starts at 1): Llama, Qwen3
  one_plus_weight,  // x / rms(x) * (1 + w) in float32, cast after (w starts at 0): Gemma 2
};

// x / rms(x) scaled per channel. Reduced-precision inputs are normalised in float32; float64
// stays float64 (a float64 reference would lose its precision otherwise).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, NormScale scale = NormScale::weight);
  at::Tensor forward(const at::Tensor& x);
  // The registered parameter; SequenceParallel replaces it (refresh_norm_weights in
  // decoder_plan.h points this member at the replacement).
  at::Tensor weight;
  NormScale scale() const { return scale_; }

 private:
  double eps_;
  NormScale scale_;
};
TORCH_MODULE(RMSNorm);

struct AttentionOptions {
  int64_t dim = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads: query head h reads key/value head h / (n_heads / n_kv_heads)
  int64_t head_dim = 0;    // even
  RopeLayout rope_layout = RopeLayout::adjacent_pairs;
  // Per-head RMSNorm of queries and keys over head_dim (weights [head_dim], scaled by w)
  // before RoPE: Qwen3's.
  bool qk_norm = false;
  double qk_norm_eps = 1e-6;
  // Scores q.k: 0 divides them by sqrt(head_dim); > 0 multiplies them by this (Gemma 2's
  // query_pre_attn_scalar^-1/2, transformers' order).
  double score_scale = 0.0;
  // > 0: scores become cap * tanh(scores / cap) before the mask (Gemma 2).
  double score_softcap = 0.0;
  // > 0: query q reads keys q - sliding_window < k <= q; 0: every earlier key (causal).
  int64_t sliding_window = 0;
  // The softmax of reduced-precision scores taken in float32 and cast back (transformers'
  // Gemma 2); false: in the scores' dtype.
  bool softmax_in_float32 = false;
};

// Causal grouped-query attention: x [batch, seq, dim] -> [batch, seq, dim].
class GroupedQueryAttentionImpl : public torch::nn::Module {
 public:
  explicit GroupedQueryAttentionImpl(const AttentionOptions& options);
  // cos/sin: rope_tables' [max_seq_len, head_dim / 2].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  const AttentionOptions& options() const { return options_; }
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // with options.qk_norm only

 private:
  AttentionOptions options_;
};
TORCH_MODULE(GroupedQueryAttention);

enum class MlpActivation {
  silu,       // SwiGLU: Llama, Qwen3 (hidden_act "silu")
  gelu_tanh,  // GeGLU with tanh-approximated GELU: Gemma 2 (hidden_activation "gelu_pytorch_tanh")
};

struct GatedMlpOptions {
  int64_t dim = 0;
  int64_t hidden_dim = 0;
  MlpActivation activation = MlpActivation::silu;
};

// w2(act(w1(x)) * w3(x)) (transformers' gate_proj, down_proj, up_proj).
class GatedMlpImpl : public torch::nn::Module {
 public:
  explicit GatedMlpImpl(const GatedMlpOptions& options);
  at::Tensor forward(const at::Tensor& x);
  const GatedMlpOptions& options() const { return options_; }
  torch::nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};

 private:
  GatedMlpOptions options_;
};
TORCH_MODULE(GatedMlp);

struct DecoderBlockOptions {
  AttentionOptions attention = {};
  GatedMlpOptions mlp = {};
  double norm_eps = 1e-5;
  NormScale norm_scale = NormScale::weight;
  // A norm after the attention and after the MLP too, before each residual add (Gemma 2).
  bool post_norms = false;
};

// h = x + [post_attention_norm](attention(attention_norm(x)));
// out = h + [post_ffn_norm](feed_forward(ffn_norm(h))).
// Under sequence parallel x and h are Shard(1) DTensors and the norms SequenceParallel.
class DecoderBlockImpl : public torch::nn::Module {
 public:
  explicit DecoderBlockImpl(const DecoderBlockOptions& options);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  const DecoderBlockOptions& options() const { return options_; }
  RMSNorm attention_norm{nullptr}, post_attention_norm{nullptr}, ffn_norm{nullptr}, post_ffn_norm{nullptr};
  GroupedQueryAttention attention{nullptr};
  GatedMlp feed_forward{nullptr};

 private:
  DecoderBlockOptions options_;
};
TORCH_MODULE(DecoderBlock);

}  // namespace hyper_parallel

HP_PUBLIC_END
