#include "hyper_parallel/models/llama.h"

namespace hyper_parallel {

DecoderBlockOptions llama_block_options(const LlamaArgs& a) {
  DecoderBlockOptions o;
  o.attention = {.dim = a.dim,
                 .n_heads = a.n_heads,
                 .n_kv_heads = a.resolved_kv_heads(),
                 .head_dim = a.resolved_head_dim(),
                 .rope_layout = RopeLayout::adjacent_pairs,
                 .qk_norm_eps = a.norm_eps};
  o.mlp = {.dim = a.dim, .hidden_dim = a.hidden_dim(), .activation = MlpActivation::silu};
  o.norm_eps = a.norm_eps;
  o.norm_scale = NormScale::weight;
  return o;
}

DecoderModelParts llama_model_parts(const std::string& family, const LlamaArgs& a,
                                    DecoderBlockOptions (*block_options)(const LlamaArgs&)) {
  TORCH_CHECK(a.head_dim > 0 || a.dim % a.n_heads == 0, family, ": dim ", a.dim, " must be divisible by n_heads ",
              a.n_heads, " (or head_dim given)");
  TORCH_CHECK(a.n_heads % a.resolved_kv_heads() == 0, family, ": n_heads ", a.n_heads,
              " must be a multiple of n_kv_heads ", a.resolved_kv_heads());
  TORCH_CHECK(a.resolved_head_dim() % 2 == 0, family, ": head_dim ", a.resolved_head_dim(), " must be even for RoPE");
  const DecoderBlockOptions blocks = block_options(a);
  DecoderSizes sizes = a;
  sizes.n_kv_heads = a.resolved_kv_heads();
  sizes.head_dim = a.resolved_head_dim();
  sizes.ffn_hidden_dim = a.hidden_dim();
  return {.family = family,
          .sizes = sizes,
          .blocks = [blocks](int64_t) { return blocks; },
          .norm_scale = NormScale::weight,
          .rope_tables = llama_rope_tables(a)};
}

LlamaImpl::LlamaImpl(const LlamaArgs& a)
    : DecoderModelImpl(llama_model_parts("Llama", a, llama_block_options)), args_(a) {}

}  // namespace hyper_parallel
