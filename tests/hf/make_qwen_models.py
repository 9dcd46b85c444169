"""Tiny random transformers Qwen3ForCausalLM checkpoints, made offline, and what
transformers computes on them: the reference for tests/models/hf_qwen3_test.cpp.

    python make_qwen_models.py DIR

See hf_reference.py for what DIR/<case>/ holds. Exits 77 without transformers.
"""
import sys

from hf_reference import make_models, rms_norm_in_float64, torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3 import modeling_qwen3

# The per-head q/k norms get random weights too (make_models), so that their permutation
# within a head matters.
BASE = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
            head_dim=16, intermediate_size=64, vocab_size=101, max_position_embeddings=64,
            rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters=dict(rope_type="default",
                                                                               rope_theta=1000000.0))
CASES = {
    # GQA 8 query / 4 kv heads (TP 4 splits them), an explicit head_dim (8 x 16 != 48),
    # uneven vocabulary.
    "gqa": dict(),
    # Small Qwen3 checkpoints (0.6B to 4B) tie the head to the embeddings.
    "tied": dict(config=dict(tie_word_embeddings=True)),
    # Stored in bfloat16 and sharded: the loader converts, and goes by the index.
    "bf16_sharded": dict(save=dict(max_shard_size="20KB"), store_dtype=torch.bfloat16),
}

if __name__ == "__main__":
    rms_norm_in_float64(modeling_qwen3.Qwen3RMSNorm)
    make_models(sys.argv[1], Qwen3Config, Qwen3ForCausalLM, BASE, CASES)
