"""What make_llama_models.py and make_qwen_models.py share: tiny random transformers
models saved offline, and what transformers computes on them (the references of
tests/harness/hf_parity.cpp).

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
except ImportError as e:  # pragma: no cover - depends on the venv
    print(f"SKIP: {e} (scripts/common.sh installs transformers into the venv)")
    sys.exit(77)

transformers.utils.logging.disable_progress_bar()


def rms_norm_in_float64(norm_class):
    """transformers' RMSNorms compute in float32 whatever the input dtype, which for a
    float64 model is a rounding step; the float64 reference keeps the same formula in
    float64 (float32 and lower precisions are left as transformers has them)."""
    original = norm_class.forward

    def forward(self, hidden_states):
        if hidden_states.dtype != torch.float64:
            return original(self, hidden_states)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    norm_class.forward = forward


def make_models(out, config_class, model_class, base, cases, attn_implementation="sdpa", norm_weights=(0.5, 1.5)):
    """cases: name -> dict(config=overrides of base, save=save_pretrained kwargs,
    store_dtype=the dtype the checkpoint is stored in, float32 by default).
    norm_weights: the range the norm weights are drawn from (scaling by the weight: around
    1; Gemma's scaling by 1 + weight: around 0)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(base["vocab_size"], (2, 12), generator=gen)
    targets = torch.randint(base["vocab_size"], (2, 12), generator=gen)
    for name, case in cases.items():
        folder = os.path.join(out, name)
        config = config_class(**{**base, **case.get("config", {})})
        model = model_class(config)
        case_tokens = tokens.clone()
        if config.pad_token_id is not None:  # its embedding row gets no gradient from the lookup
            case_tokens[0, 3] = case_tokens[1, 7] = config.pad_token_id
        with torch.no_grad():  # norms away from their initial value so that their gradients and values matter
            for n, p in model.named_parameters():
                if n.endswith("norm.weight"):
                    p.uniform_(*norm_weights)
        model.to(case.get("store_dtype", torch.float32)).save_pretrained(folder, **case.get("save", {}))
        for dtype in (torch.float64, torch.float32):
            ref = model_class.from_pretrained(folder, dtype=dtype, attn_implementation=attn_implementation)
            logits = ref(input_ids=case_tokens).logits
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            loss.backward()
            result = {"tokens": case_tokens, "targets": targets, "logits": logits.detach(), "loss": loss.detach()}
            for n, p in ref.named_parameters():
                result["grad." + n] = p.grad
            save_file({k: v.contiguous() for k, v in result.items()},
                      os.path.join(folder, f"reference_{str(dtype).split('.')[-1]}.safetensors"))
    print(f"transformers {transformers.__version__}: {len(cases)} {model_class.__name__} models in {out}")
