"""What transformers makes of our Hugging Face exports (tests/models/hf_export_test.cpp).

    python check_hf_export.py JOBS.json

JOBS.json is a list of {"source": DIR, "export": DIR, "dtype": "float32" | "bfloat16"}: an
export of our model loaded from the transformers checkpoint in `source`. For each job one
JSON line on stdout:
  weights_equal    every tensor of the export, read with safetensors.torch.load_file, equals
                   the source's (rounded to bfloat16 by torch for a bfloat16 export), and
                   the names are the source's
  loading_info     what from_pretrained reported missing/unexpected/mismatched (all empty)
  tie              the export's config.tie_word_embeddings
  d_logits         max |logits(export) - logits(source)|, both run in float32; for a
                   bfloat16 export the source's parameters are first rounded by torch
                   (.to(bfloat16).to(float32)): the same weights, so 0 is expected
  d_logits_fp32    for a bfloat16 export: against the unrounded source (the rounding's effect)
  max_logit        max |logits(source)| (the scale of the above)
Exits 77 when transformers is not importable.
"""
import glob
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
except ImportError as e:  # pragma: no cover - depends on the venv
    print(f"SKIP: {e}")
    sys.exit(77)

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()


def load(folder):
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    return model.eval(), {k: sorted(map(str, v)) for k, v in info.items() if v}


def check(job):
    source, _ = load(job["source"])
    tokens = torch.randint(source.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(3))
    export, info = load(job["export"])
    bf16 = job["dtype"] == "bfloat16"
    written = {}
    for path in sorted(glob.glob(os.path.join(job["export"], "*.safetensors"))):
        written.update(load_file(path))
    expected = {k: (v.to(torch.bfloat16) if bf16 else v) for k, v in source.state_dict().items()}
    if source.config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    weights_equal = set(written) == set(expected) and all(
        written[k].dtype == expected[k].dtype and torch.equal(written[k], expected[k]) for k in expected)
    with torch.no_grad():
        original = source(input_ids=tokens).logits
        if bf16:  # the parameters only: .to() would round the rotary inv_freq buffer too
            for p in source.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
        reference = source(input_ids=tokens).logits
        logits = export(input_ids=tokens).logits
    result = {
        "export": job["export"],
        "dtype": job["dtype"],
        "weights_equal": weights_equal,
        "loading_info": info,
        "tie": bool(export.config.tie_word_embeddings),
        "d_logits": (logits - reference).abs().max().item(),
        "max_logit": original.abs().max().item(),
    }
    if bf16:
        result["d_logits_fp32"] = (logits - original).abs().max().item()
    return result


def main(jobs_file):
    for job in json.load(open(jobs_file)):
        print(json.dumps(check(job)), flush=True)
    print(f"transformers {transformers.__version__}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
