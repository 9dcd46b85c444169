"""Tiny random transformers LlamaForCausalLM checkpoints, made offline, and what
transformers computes on them: the reference for tests/hf_llama_parity_test.cpp.

    python make_llama_models.py DIR

For each case, DIR/<case>/ holds the save_pretrained folder (config.json, safetensors) and
reference_<dtype>.safetensors: the tokens and targets, transformers' logits, the mean
cross-entropy and every parameter's gradient under its Hugging Face name ("grad.<name>"),
for float64 and float32. Exits 77 when transformers is not importable (the test skips).
"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is made locally
try:
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama
except ImportError as e:  # pragma: no cover - depends on the venv
    print(f"SKIP: {e} (scripts/common.sh installs transformers into the venv)")
    sys.exit(77)

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


def rms_norm_in_input_dtype(self, hidden_states):
    # transformers' LlamaRMSNorm computes in float32 whatever the input dtype, which for a
    # float64 model is a rounding step; the float64 reference keeps the same formula in
    # float64 (float32 and lower precisions are left as transformers has them).
    if hidden_states.dtype != torch.float64:
        return original_rms_norm(self, hidden_states)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


transformers.utils.logging.disable_progress_bar()
original_rms_norm = modeling_llama.LlamaRMSNorm.forward
modeling_llama.LlamaRMSNorm.forward = rms_norm_in_input_dtype


def main(out):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(BASE["vocab_size"], (2, 12), generator=gen)
    targets = torch.randint(BASE["vocab_size"], (2, 12), generator=gen)
    for name, case in CASES.items():
        folder = os.path.join(out, name)
        cfg = LlamaConfig(**{**BASE, **case.get("config", {})})
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():  # norms away from 1 so that their gradients and values matter
            for n, p in model.named_parameters():
                if n.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
        model.to(case.get("store_dtype", torch.float32)).save_pretrained(folder, **case["save"])
        for dtype in (torch.float64, torch.float32):
            ref = LlamaForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
            logits = ref(input_ids=tokens).logits
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            loss.backward()
            result = {"tokens": tokens, "targets": targets, "logits": logits.detach(), "loss": loss.detach()}
            for n, p in ref.named_parameters():
                result["grad." + n] = p.grad
            save_file({k: v.contiguous() for k, v in result.items()},
                      os.path.join(folder, f"reference_{str(dtype).split('.')[-1]}.safetensors"))
    print(f"transformers {transformers.__version__}: {len(CASES)} models in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
