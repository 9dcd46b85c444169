// The family-neutral decoder blocks (decoder_blocks.h, rope.h, decoder_plan.h) against
// float64 references written out here: each option does what it says, and the plan, the
// Hugging Face names and the shape checks follow the options.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "hyper_parallel/models/decoder_blocks.h"
#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/decoder_size_rules.h"

namespace decoder_blocks_test {

using namespace hyper_parallel;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

at::Tensor random(at::IntArrayRef sizes, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(sizes, gen, at::kDouble);
}

void randomize(torch::nn::Module& m, uint64_t seed) {
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.copy_(random(p.sizes(), seed++) * 0.3);
}

// Head channels in rotate-half order (i, i + d/2) -> adjacent pairs (2i, 2i + 1).
at::Tensor to_adjacent_pairs(const at::Tensor& x) { return x.unflatten(-1, {2, -1}).transpose(-1, -2).flatten(-2); }

at::Tensor rms_normalised(const at::Tensor& x, double eps) { return x / (x.pow(2).mean({-1}, true) + eps).sqrt(); }

AttentionOptions small_attention() { return {.dim = 24, .n_heads = 4, .n_kv_heads = 2, .head_dim = 6}; }

// Attention written head by head: scores, scale, soft-cap, mask, softmax, values.
at::Tensor reference_attention(GroupedQueryAttentionImpl& m, const at::Tensor& x, const at::Tensor& cos,
                               const at::Tensor& sin) {
  const AttentionOptions& o = m.options();
  const int64_t b = x.size(0), s = x.size(1), d = o.head_dim;
  auto heads = [&](const at::Tensor& t) { return t.view({b, s, -1, d}); };
  at::Tensor q = heads(at::linear(x, m.wq->weight)), k = heads(at::linear(x, m.wk->weight));
  const at::Tensor v = heads(at::linear(x, m.wv->weight));
  if (o.qk_norm) {
    q = rms_normalised(q, o.qk_norm_eps) * m.q_norm->weight;
    k = rms_normalised(k, o.qk_norm_eps) * m.k_norm->weight;
  }
  q = apply_rope(q, cos, sin, o.rope_layout);
  k = apply_rope(k, cos, sin, o.rope_layout);
  const int64_t group = o.n_heads / o.n_kv_heads;
  std::vector<at::Tensor> outs;
  for (int64_t h = 0; h < o.n_heads; ++h) {
    const at::Tensor qh = q.select(2, h), kh = k.select(2, h / group), vh = v.select(2, h / group);
    at::Tensor scores = at::matmul(qh, kh.transpose(-2, -1));
    scores = o.score_scale > 0 ? scores * o.score_scale : scores / std::sqrt(static_cast<double>(d));
    if (o.score_softcap > 0) scores = at::tanh(scores / o.score_softcap) * o.score_softcap;
    for (int64_t i = 0; i < s; ++i) {
      for (int64_t j = 0; j < s; ++j) {
        const bool hidden = j > i || (o.sliding_window > 0 && j <= i - o.sliding_window);
        if (hidden) scores.select(1, i).select(1, j).fill_(-std::numeric_limits<double>::infinity());
      }
    }
    outs.push_back(at::matmul(at::softmax(scores, -1), vh));
  }
  return at::linear(at::stack(outs, 2).flatten(-2), m.wo->weight);
}

std::vector<std::string> plan_keys(const ParallelizePlan& plan) {
  std::vector<std::string> keys;
  for (const auto& [key, style] : plan) keys.push_back(key);
  return keys;
}

}  // namespace

// Both layouts rotate the same pairs of channels: after moving a head's channels from
// rotate-half order to adjacent pairs, the two agree exactly.
TEST(DecoderBlocks, RopeLayoutsAgreeOnceTheHeadChannelsArePermuted) {
  const auto [cos, sin] = rope_tables({.head_dim = 8, .theta = 10000.0, .max_seq_len = 16});
  EXPECT_EQ(cos.sizes().vec(), (std::vector<int64_t>{16, 4}));
  const at::Tensor x = random({2, 5, 3, 8}, 1);
  const at::Tensor half = apply_rope(x, cos, sin, RopeLayout::rotate_half);
  const at::Tensor pairs = apply_rope(to_adjacent_pairs(x), cos, sin, RopeLayout::adjacent_pairs);
  EXPECT_TRUE(at::allclose(pairs, to_adjacent_pairs(half), 1e-15, 1e-15))
      << (pairs - to_adjacent_pairs(half)).abs().max().item<double>();
  // Position 0 is the identity; the rotation keeps each pair's length.
  EXPECT_TRUE(at::allclose(half.select(1, 0), x.select(1, 0)));
  EXPECT_TRUE(at::allclose(half.pow(2).sum(-1), x.pow(2).sum(-1), 1e-6));  // float32 tables
}

// transformers' float32 tables and ours in float64 rounded once differ by rounding only;
// llama3 scaling slows the low frequencies down.
TEST(DecoderBlocks, RopeTablesInBothPrecisionsAndWithLlama3Scaling) {
  RopeTableOptions o{.head_dim = 16, .theta = 500000.0, .max_seq_len = 64};
  const auto [cos64, sin64] = rope_tables(o);
  o.like_transformers = true;
  const auto [cos32, sin32] = rope_tables(o);
  EXPECT_EQ(cos32.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::allclose(cos32, cos64, 0, 5e-5)) << (cos32 - cos64).abs().max().item<double>();
  EXPECT_TRUE(at::allclose(sin32, sin64, 0, 5e-5)) << (sin32 - sin64).abs().max().item<double>();
  // Wavelengths below 64 / high_freq_factor (4) are kept, those above 64 / low_freq_factor
  // (1) slowed down by the factor.
  o.llama3_scaling = Llama3RopeScaling{.factor = 8.0, .original_max_position_embeddings = 64};
  const auto [cos_scaled, sin_scaled] = rope_tables(o);
  EXPECT_TRUE(at::equal(sin_scaled.select(1, 0), sin32.select(1, 0)));               // wavelength 2 pi
  EXPECT_TRUE(at::allclose(sin_scaled.select(1, 7) * 8, sin32.select(1, 7), 1e-3));  // 6e5
  EXPECT_THROW(rope_tables({.head_dim = 7, .max_seq_len = 4}), c10::Error);
}

// w starts at 1 for NormScale::weight and at 0 for one_plus_weight: both start as the
// identity scale, and scale by w and 1 + w once trained.
TEST(DecoderBlocks, RmsNormScalesByWeightOrByOnePlusWeight) {
  const at::Tensor x = random({3, 4, 10}, 2);
  RMSNorm by_w(10, 1e-5), by_one_plus_w(10, 1e-5, NormScale::one_plus_weight);
  by_w->to(at::kDouble);
  by_one_plus_w->to(at::kDouble);
  EXPECT_TRUE(at::allclose(by_w(x), rms_normalised(x, 1e-5), 1e-12));
  EXPECT_TRUE(at::allclose(by_one_plus_w(x), rms_normalised(x, 1e-5), 1e-12));
  randomize(*by_w, 3);
  randomize(*by_one_plus_w, 3);
  EXPECT_TRUE(at::allclose(by_w(x), rms_normalised(x, 1e-5) * by_w->weight, 1e-12));
  EXPECT_TRUE(at::allclose(by_one_plus_w(x), rms_normalised(x, 1e-5) * (1 + by_one_plus_w->weight), 1e-12));
  // bfloat16: normalised in float32 either way.
  const at::Tensor xb = x.to(at::kBFloat16);
  by_w->to(at::kBFloat16);
  EXPECT_EQ(by_w(xb).scalar_type(), at::kBFloat16);
  EXPECT_TRUE(
      at::allclose(by_w(xb).to(at::kDouble), rms_normalised(x, 1e-5) * by_w->weight.to(at::kDouble), 0.05, 0.05));
}

// Each attention option against the head-by-head reference, float64: grouped key/values,
// q/k norms, both RoPE layouts, a score scale with soft-capping, a sliding window.
TEST(DecoderBlocks, GroupedQueryAttentionMatchesAHeadByHeadReferenceForEachOption) {
  std::vector<std::pair<std::string, AttentionOptions>> cases;
  cases.emplace_back("plain", small_attention());
  AttentionOptions qk = small_attention();
  qk.qk_norm = true;
  cases.emplace_back("q/k norms", qk);
  AttentionOptions gemma = small_attention();
  gemma.rope_layout = RopeLayout::rotate_half;
  gemma.score_scale = std::pow(5.0, -0.5);
  gemma.score_softcap = 0.7;
  gemma.softmax_in_float32 = true;
  cases.emplace_back("scale and soft-cap", gemma);
  AttentionOptions window = gemma;
  window.sliding_window = 3;
  cases.emplace_back("sliding window", window);
  const auto [cos, sin] = rope_tables({.head_dim = 6, .max_seq_len = 16});
  const at::Tensor x = random({2, 7, 24}, 4);
  for (const auto& [what, options] : cases) {
    GroupedQueryAttention attention(options);
    attention->to(at::kDouble);
    randomize(*attention, 5);
    const at::Tensor got = attention->forward(x, cos, sin);
    const at::Tensor want = reference_attention(*attention, x, cos, sin);
    EXPECT_TRUE(at::allclose(got, want, 1e-10, 1e-12))
        << what << ": max difference " << (got - want).abs().max().item<double>();
    EXPECT_EQ(attention->q_norm.is_empty(), !options.qk_norm) << what;
  }
  // A window of one key: each query reads only itself, so the output is the values' own.
  AttentionOptions self = small_attention();
  self.n_kv_heads = 4;
  self.sliding_window = 1;
  GroupedQueryAttention attention(self);
  attention->to(at::kDouble);
  randomize(*attention, 6);
  const at::Tensor own_value = at::linear(at::linear(x, attention->wv->weight), attention->wo->weight);
  EXPECT_TRUE(at::allclose(attention->forward(x, cos, sin), own_value, 1e-10, 1e-12));
}

TEST(DecoderBlocks, GatedMlpActivationIsAnOption) {
  const at::Tensor x = random({2, 3, 8}, 7);
  for (MlpActivation act : {MlpActivation::silu, MlpActivation::gelu_tanh}) {
    GatedMlp mlp(GatedMlpOptions{.dim = 8, .hidden_dim = 12, .activation = act});
    mlp->to(at::kDouble);
    randomize(*mlp, 8);
    const at::Tensor gate = at::linear(x, mlp->w1->weight);
    const at::Tensor activated =
        act == MlpActivation::silu ? gate * at::sigmoid(gate)
                                   : 0.5 * gate * (1 + at::tanh(std::sqrt(2 / M_PI) * (gate + 0.044715 * gate.pow(3))));
    const at::Tensor want = at::linear(activated * at::linear(x, mlp->w3->weight), mlp->w2->weight);
    EXPECT_TRUE(at::allclose(mlp(x), want, 1e-10, 1e-12));
  }
}

// Pre-norms only (Llama) or post-norms too (Gemma 2), in the order checkpoints and the seeded
// initialisation read them; the block is its parts chained around two residual adds.
TEST(DecoderBlocks, BlockRegistersItsNormsInCheckpointOrderAndChainsItsParts) {
  DecoderBlockOptions o{.attention = small_attention(), .mlp = {.dim = 24, .hidden_dim = 16}};
  std::vector<std::string> names;
  for (const auto& p : DecoderBlock(o)->named_parameters()) names.push_back(p.key());
  EXPECT_THAT(names, ElementsAre("attention_norm.weight", "attention.wq.weight", "attention.wk.weight",
                                 "attention.wv.weight", "attention.wo.weight", "ffn_norm.weight",
                                 "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight"));
  o.post_norms = true;
  o.norm_scale = NormScale::one_plus_weight;
  o.attention.qk_norm = true;
  DecoderBlock block(o);
  names.clear();
  for (const auto& p : block->named_parameters()) names.push_back(p.key());
  EXPECT_THAT(names,
              ElementsAre("attention_norm.weight", "attention.wq.weight", "attention.wk.weight", "attention.wv.weight",
                          "attention.wo.weight", "attention.q_norm.weight", "attention.k_norm.weight",
                          "post_attention_norm.weight", "ffn_norm.weight", "feed_forward.w1.weight",
                          "feed_forward.w2.weight", "feed_forward.w3.weight", "post_ffn_norm.weight"));
  block->to(at::kDouble);
  randomize(*block, 9);
  const auto [cos, sin] = rope_tables({.head_dim = 6, .max_seq_len = 8});
  const at::Tensor x = random({2, 5, 24}, 10);
  const at::Tensor h = x + block->post_attention_norm(block->attention->forward(block->attention_norm(x), cos, sin));
  const at::Tensor want = h + block->post_ffn_norm(block->feed_forward(block->ffn_norm(h)));
  EXPECT_TRUE(at::allclose(block->forward(x, cos, sin), want, 1e-12, 1e-12));
}

TEST(DecoderBlocks, TpPlanFollowsTheBlockOptions) {
  DecoderBlockOptions o;
  const std::vector<std::string> tp = plan_keys(decoder_tp_plan(o, /*loss_parallel=*/true));
  EXPECT_THAT(tp, ElementsAre("tok_embeddings", "layers.*.attention.wq", "layers.*.attention.wk",
                              "layers.*.attention.wv", "layers.*.attention.wo", "layers.*.feed_forward.w1",
                              "layers.*.feed_forward.w3", "layers.*.feed_forward.w2", "output"));
  EXPECT_EQ(plan_keys(decoder_tp_plan(o, true, /*sequence_parallel=*/true)).size(), 14u);
  o.post_norms = true;
  EXPECT_EQ(plan_keys(decoder_tp_plan(o, true)), tp);  // post-norms are per token: only SP shards them
  std::vector<std::string> sp = plan_keys(decoder_tp_plan(o, true, true));
  EXPECT_THAT(std::vector<std::string>(sp.end() - 2, sp.end()),
              ElementsAre("layers.*.post_attention_norm", "layers.*.post_ffn_norm"));
  o.attention.qk_norm = true;
  sp = plan_keys(decoder_tp_plan(o, false, true));
  EXPECT_THAT(std::vector<std::string>(sp.end() - 2, sp.end()),
              ElementsAre("layers.*.attention.q_norm", "layers.*.attention.k_norm"));
}

TEST(DecoderBlocks, HfNamesFollowTheBlockOptions) {
  DecoderBlockOptions o{.attention = small_attention()};
  HfAdapter llama = decoder_hf_adapter(o, /*n_layers=*/2, /*tie_word_embeddings=*/false);
  ASSERT_EQ(llama.size(), 1u + 2 * 9 + 2);
  EXPECT_EQ(llama[1].hf, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(llama[1].rope_head_dim, 6);  // adjacent pairs here, rotate-half in the file
  EXPECT_EQ(llama[9].ours, "layers.0.ffn_norm.weight");
  EXPECT_EQ(llama[9].hf, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(llama.back().hf, "lm_head.weight");
  o.attention.rope_layout = RopeLayout::rotate_half;
  o.post_norms = true;
  HfAdapter gemma = decoder_hf_adapter(o, 1, /*tie_word_embeddings=*/true);
  ASSERT_EQ(gemma.size(), 1u + 11 + 1);
  EXPECT_EQ(gemma[1].rope_head_dim, 0);
  EXPECT_EQ(gemma[9].hf, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(gemma[10].hf, "model.layers.0.pre_feedforward_layernorm.weight");
  EXPECT_EQ(gemma.back().hf, "model.norm.weight");  // tied: no lm_head
  o = DecoderBlockOptions{.attention = small_attention()};
  o.attention.qk_norm = true;
  HfAdapter qwen = decoder_hf_adapter(o, 2, true);
  ASSERT_EQ(qwen.size(), 1u + 2 * 9 + 1 + 4);
  EXPECT_EQ(qwen[20].ours, "layers.0.attention.q_norm.weight");
  EXPECT_EQ(qwen[20].hf, "model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(qwen[20].rope_head_dim, 6);
}

TEST(DecoderBlocks, ShapeChecksNameEachSize) {
  DecoderBlockOptions o{.attention = {.dim = 24, .n_heads = 6, .n_kv_heads = 2, .head_dim = 4},
                        .mlp = {.dim = 24, .hidden_dim = 18}};
  EXPECT_TRUE(decoder_tp_misfits(o, 2, "who").empty());
  const std::vector<std::string> at3 = decoder_tp_misfits(o, 3, "parallelize_x");
  ASSERT_EQ(at3.size(), 1u);
  EXPECT_THAT(at3[0], HasSubstr("parallelize_x: n_kv_heads 2 does not split over tensor_parallel_degree 3"));
  EXPECT_EQ(decoder_tp_misfits(o, 4, "x").size(), 3u);  // heads 6, kv heads 2, ffn hidden 18
  // One check under both wordings: the job's leaves the widths (the family's) unchecked.
  EXPECT_THAT(decoder_tp_split_misfits({.n_heads = 6, .n_kv_heads = 2, .dim = 24, .ffn_hidden_dim = 18}, 4),
              ElementsAre(DecoderTpMisfit::n_heads, DecoderTpMisfit::n_kv_heads, DecoderTpMisfit::widths));
  EXPECT_THAT(decoder_tp_split_misfits({.n_heads = 6, .n_kv_heads = 0}, 4), ElementsAre(DecoderTpMisfit::n_heads));

  DecoderSizes s;
  s.dim = 30;
  s.n_heads = 4;
  s.n_kv_heads = 3;
  EXPECT_THAT(decoder_size_errors(s), ElementsAre("model.n_kv_heads = 3 must divide model.n_heads = 4",
                                                  "model.dim = 30 must be divisible by model.n_heads = 4 (or set "
                                                  "model.head_dim)"));
  s.dim = 24;
  s.n_heads = 8;
  s.n_kv_heads = 0;
  EXPECT_THAT(decoder_size_errors(s),
              ElementsAre("model.dim / model.n_heads = 3 (the head size) must be even for RoPE"));
  s.head_dim = 4;
  EXPECT_TRUE(decoder_size_errors(s).empty());
  EXPECT_TRUE(decoder_tp_size_errors(s, 2).empty());
  EXPECT_THAT(decoder_tp_size_errors(s, 3),
              ElementsAre("model.n_heads = 8 must be divisible by parallelism.tensor_parallel_degree = 3"));
}

}  // namespace decoder_blocks_test
