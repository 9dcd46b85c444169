#!/usr/bin/env bash
# Fine-tune a Hugging Face Llama with TP 2 and loss_parallel, end to end and offline
# (docs/hf_models.md, "Fine-tuning recipe"):
#   1. a tiny random transformers LlamaForCausalLM (GQA) and a byte-level BPE tokenizer
#      trained on the repository's own docs, saved with save_pretrained;
#   2. the docs tokenized into a flat .bin with scripts/tokenize_corpus.py;
#   3. hp-run hp-train at TP 2 starting from the checkpoint (model.hf_assets_path,
#      checkpoint.initial_load_in_hf), writing its last step as a Hugging Face folder too
#      (checkpoint.last_save_in_hf);
#   4. that folder loaded in transformers;
#   5. the same step exported afterwards with hp-hf-export: the same weights, byte for byte.
#
#   scripts/hf_finetune_recipe.sh [WORK_DIR] [-- hp-train overrides]
#
# Needs a build (hp_build hp-run hp-train hp-hf-export) and the venv's transformers and tokenizers
# (scripts/common.sh installs them); exits 77 without them.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
work="${1:-outputs/hf_finetune_recipe}"
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
python="$(hp_python)"
hp_require_binaries hp-run hp-train hp-hf-export
if [ -z "$python" ] || ! "$python" -c 'import transformers, tokenizers' 2>/dev/null; then
  echo "SKIP: the venv has no transformers/tokenizers (source scripts/common.sh && hp_install_missing)" >&2
  exit 77
fi
mkdir -p "$work"

echo "==> 1. a tiny Llama and a tokenizer, made offline in $work/model"
HF_HUB_OFFLINE=1 "$python" - "$work/model" "$HP_ROOT"/README.md "$HP_ROOT"/docs/*.md <<'EOF'
import sys
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out, texts = sys.argv[1], sys.argv[2:]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train(texts, trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"],
                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(out)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  eos_token_id=tok.token_to_id("<|endoftext|>"), bos_token_id=None)
LlamaForCausalLM(cfg).save_pretrained(out)
print(f"model: {sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())} parameters, vocab {cfg.vocab_size}")
EOF

echo "==> 2. the docs tokenized into $work/data/corpus.bin"
"$python" "$HP_ROOT/scripts/tokenize_corpus.py" --tokenizer "$work/model" --input "$HP_ROOT"/README.md \
  "$HP_ROOT"/docs/*.md --output "$work/data/corpus" --format bin

echo "==> 3. hp-train at TP 2 with loss_parallel, starting from the checkpoint"
"$bin/hp-run" --nproc-per-node 2 "$bin/hp-train" \
  --model.hf_assets_path "$work/model" --checkpoint.initial_load_in_hf \
  --training.data "$work/data/corpus.bin" --training.steps 40 --training.batch_size 8 --training.seq_len 64 \
  --lr_scheduler.warmup_steps 4 --training.lr 3e-3 --parallelism.tensor_parallel_degree 2 \
  --validation.freq 20 --checkpoint.enable --checkpoint.interval 40 --checkpoint.overwrite \
  --checkpoint.last_save_in_hf --metrics.enable_plot false --job.dump_folder "$work/run" "$@"

echo "==> 4. load the run's Hugging Face checkpoint ($work/run/hf/step-40) in transformers"
"$python" -c "import sys; from transformers import LlamaForCausalLM; m = LlamaForCausalLM.from_pretrained(sys.argv[1]); print('transformers loaded', sys.argv[1], sum(p.numel() for p in m.parameters()), 'parameters')" "$work/run/hf/step-40"

echo "==> 5. the same step exported afterwards with hp-hf-export (any checkpoint, any dp x tp)"
"$bin/hp-hf-export" "$work/run/checkpoints" "$work/export" --source "$work/model"
cmp "$work/export/model.safetensors" "$work/run/hf/step-40/model.safetensors" && echo "hp-hf-export wrote the same weights"
