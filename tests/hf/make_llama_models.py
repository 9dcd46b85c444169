"""Tiny random transformers LlamaForCausalLM checkpoints, made offline, and what
transformers computes on them: the reference for tests/models/hf_llama_parity_test.cpp.

    python make_llama_models.py DIR

See hf_reference.py for what DIR/<case>/ holds. Exits 77 without transformers.
"""
import sys

from hf_reference import make_models, rms_norm_in_float64, torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

BASE = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
            head_dim=16, intermediate_size=64, vocab_size=101, max_position_embeddings=64,
            rms_norm_eps=1e-6, tie_word_embeddings=False)
CASES = {
    # GQA 8 query / 4 kv heads (2 query heads per kv head; TP 4 gives each rank one kv
    # head), an explicit head_dim (8 x 16 != 48), uneven vocabulary.
    "gqa": dict(save={}),
    "tied": dict(config=dict(tie_word_embeddings=True), save={}),
    "llama3": dict(config=dict(rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                                    low_freq_factor=1.0, high_freq_factor=4.0,
                                                    original_max_position_embeddings=16)), save={}),
    "sharded": dict(save=dict(max_shard_size="40KB")),
    # Stored in bfloat16: the loader converts to the training dtype.
    "bf16": dict(save={}, store_dtype=torch.bfloat16),
}

if __name__ == "__main__":
    rms_norm_in_float64(modeling_llama.LlamaRMSNorm)
    make_models(sys.argv[1], LlamaConfig, LlamaForCausalLM, BASE, CASES)
