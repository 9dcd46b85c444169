"""Tiny random transformers Gemma2ForCausalLM checkpoints, made offline, and what
transformers computes on them: the reference for tests/models/hf_gemma2_test.cpp.

    python make_gemma2_models.py DIR

See hf_reference.py for what DIR/<case>/ holds (the logits are transformers', after the
final soft-capping). Exits 77 without transformers.
"""
import sys

from hf_reference import make_models, torch
from transformers import Gemma2Config, Gemma2ForCausalLM
from transformers.models.gemma2 import modeling_gemma2

# The test's 12 tokens are longer than every sliding window here, so the window matters.
# query_pre_attn_scalar 24 != head_dim 16: the scaling is the config's, not 1/sqrt(head_dim).
# initializer_range 0.1 (transformers' default 0.02) makes attention scores and logits
# large enough that the soft-caps change them well beyond the tolerances.
BASE = dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4,
            head_dim=16, intermediate_size=64, vocab_size=101, max_position_embeddings=64,
            rms_norm_eps=1e-6, query_pre_attn_scalar=24, sliding_window=5, initializer_range=0.1,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0))
CASES = {
    # Gemma 2's own caps (attention 50, final 30) and layer pattern (layers 0 and 2
    # sliding, 1 full), GQA 8 query / 4 kv heads (TP 4 splits them), untied head.
    "gqa": dict(config=dict(tie_word_embeddings=False)),
    # Tied, as every Gemma 2 checkpoint is; caps small enough to saturate (tanh far from
    # linear), another layer pattern and window.
    "tied": dict(config=dict(tie_word_embeddings=True, attn_logit_softcapping=1.0, final_logit_softcapping=2.0,
                             sliding_window=3,
                             layer_types=["full_attention", "sliding_attention", "sliding_attention"])),
    # No caps at all (both null), stored in bfloat16 and sharded.
    "bf16_sharded": dict(config=dict(attn_logit_softcapping=None, final_logit_softcapping=None),
                         save=dict(max_shard_size="20KB"), store_dtype=torch.bfloat16),
}


def in_float64():
    """transformers computes Gemma 2's RMSNorm in float32 and the attention softmax in float32
    whatever the input dtype, which for a float64 model is a rounding step; the float64
    reference keeps the same formulas in float64 (float32 runs are left as they are)."""
    norm_forward = modeling_gemma2.Gemma2RMSNorm.forward

    def rms_norm(self, x):
        if x.dtype != torch.float64:
            return norm_forward(self, x)
        return self._norm(x) * (1.0 + self.weight)

    modeling_gemma2.Gemma2RMSNorm.forward = rms_norm
    attention = modeling_gemma2.eager_attention_forward

    def eager_attention(module, query, *args, **kwargs):
        if query.dtype != torch.float64:
            return attention(module, query, *args, **kwargs)
        softmax = torch.nn.functional.softmax  # transformers' code, its softmax's dtype=float32 dropped
        torch.nn.functional.softmax = lambda x, dim, dtype=None: softmax(x, dim=dim)
        try:
            return attention(module, query, *args, **kwargs)
        finally:
            torch.nn.functional.softmax = softmax

    modeling_gemma2.eager_attention_forward = eager_attention


if __name__ == "__main__":
    in_float64()
    # eager: Gemma 2 has no sdpa attention in transformers (sdpa cannot soft-cap).
    make_models(sys.argv[1], Gemma2Config, Gemma2ForCausalLM, BASE, CASES, attn_implementation="eager",
                norm_weights=(-0.5, 0.5))
