#!/usr/bin/env bash
# scripts/tokenize_corpus.py end to end: a WordLevel tokenizer trained offline on a few
# lines (HF `tokenizers`), JSONL and text turned into a flat .bin and a Megatron
# .bin/.idx; the ids must be the tokenizer's own encoding of each document followed by
# EOS, the .idx fields Megatron's layout, the sidecar right; dtypes hp-train cannot read,
# inputs without text and failed runs write nothing; then hp-train trains 4 steps on each
# (auto-detected format, dtype and EOS from the sidecar).
# Usage: tokenize_corpus_test.sh PYTHON BIN_DIR SOURCE_DIR. Exit 77 (skip) without tokenizers.
set -euo pipefail
python="$1" bin="$2" src="$3"
if [ -z "$python" ] || ! "$python" -c 'import tokenizers' 2>/dev/null; then
  echo "SKIP: the Python '${python:-<none>}' has no 'tokenizers' package (scripts/common.sh installs it into the venv)"
  exit 77
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/hp_tokenize_corpus.XXXXXX")"
trap 'rm -rf "$work"' EXIT

"$python" - "$work" <<'EOF'
import json, os, sys
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
work = sys.argv[1]
lines = [f"the cat number {i % 13} sat on the mat {i % 7} times, said the dog" for i in range(300)]
tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.train_from_iterator(lines, trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|endoftext|>"]))
os.makedirs(f"{work}/tok")
tok.save(f"{work}/tok/tokenizer.json")
with open(f"{work}/docs.jsonl", "w") as f:
    for i in range(0, 300, 3):
        f.write(json.dumps({"text": " ".join(lines[i:i + 3])}) + "\n")
with open(f"{work}/docs.txt", "w") as f:
    f.write("\n\n".join(lines[:40]) + "\n")
EOF

for fmt in bin megatron; do
  "$python" "$src/scripts/tokenize_corpus.py" --tokenizer "$work/tok" --input "$work/docs.jsonl" "$work/docs.txt" \
    --output "$work/$fmt/corpus" --format "$fmt"
done

"$python" - "$work" <<'EOF'
import array, json, struct, sys
from tokenizers import Tokenizer
work = sys.argv[1]
tok = Tokenizer.from_file(f"{work}/tok/tokenizer.json")
eos = tok.token_to_id("<|endoftext|>")
texts = [json.loads(l)["text"] for l in open(f"{work}/docs.jsonl")]
texts += open(f"{work}/docs.txt").read().strip("\n").split("\n\n")
docs = [tok.encode(t, add_special_tokens=False).ids + [eos] for t in texts]
flat = [i for d in docs for i in d]

def ids(path, code):
    a = array.array(code)
    a.frombytes(open(path, "rb").read())
    return list(a)

assert ids(f"{work}/bin/corpus.bin", "H") == flat, "flat .bin is not the tokenizer's ids + EOS"
assert ids(f"{work}/megatron/corpus.bin", "H") == flat, "Megatron .bin is not the tokenizer's ids + EOS"
idx = open(f"{work}/megatron/corpus.idx", "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<Q", idx[9:17])[0] == 1 and idx[17] == 8
s, d = struct.unpack("<QQ", idx[18:34])
assert (s, d) == (len(docs), len(docs) + 1), (s, d)
lengths = list(struct.unpack(f"<{s}i", idx[34:34 + 4 * s]))
pointers = list(struct.unpack(f"<{s}q", idx[34 + 4 * s:34 + 12 * s]))
doc_idx = list(struct.unpack(f"<{d}q", idx[34 + 12 * s:]))
assert lengths == [len(x) for x in docs]
assert pointers == [2 * sum(lengths[:k]) for k in range(s)]
assert doc_idx == list(range(s + 1))
for fmt in ("bin", "megatron"):
    side = json.load(open(f"{work}/{fmt}/corpus.json"))
    want = {"format": fmt, "dtype": "uint16", "vocab_size": tok.get_vocab_size(), "eos_id": eos, "bos_id": None,
            "documents": len(docs), "tokens": len(flat)}
    assert {k: side[k] for k in want} == want, side
    assert len(side["tokenizer_sha256"]) == 64
print(f"tokenize_corpus: {len(docs)} documents, {len(flat)} tokens as expected in both formats")
EOF

tokenize() { "$python" "$src/scripts/tokenize_corpus.py" --tokenizer "$work/tok" "$@"; }

# A --dtype hp-train cannot read in that format is refused before anything is written,
# naming the dtypes it does read (pretokenized_corpus.cpp, megatron_indexed_dataset.cpp).
for refused in "bin int32 uint16 uint32" "bin uint8 uint16 uint32" \
               "megatron uint32 uint8 int8 int16 uint16 int32 int64"; do
  set -- $refused
  fmt="$1" dtype="$2"
  shift 2
  rc=0
  tokenize --input "$work/docs.jsonl" --output "$work/refused/corpus" --format "$fmt" --dtype "$dtype" \
    2> "$work/err" || rc=$?
  if [ "$rc" -eq 0 ] || [ -e "$work/refused" ]; then
    echo "--format $fmt --dtype $dtype: exit $rc, wrote" $(find "$work/refused" 2>/dev/null) "(hp-train refuses it)"
    exit 1
  fi
  for readable in "$@"; do
    grep -qw -- "$readable" "$work/err" || { cat "$work/err"; echo "$fmt $dtype: the error names no $readable"; exit 1; }
  done
done

# Input with no text (none at all, or only text that tokenizes to nothing) is an error
# naming the input, and writes nothing: a corpus of separators alone trains on nothing.
: > "$work/empty.txt"
printf '\n  \n\n' > "$work/blank.txt"
printf '{"text": ""}\n{"text": "  \\n "}\n' > "$work/no_text.jsonl"
for empty in "empty.txt" "blank.txt" "empty.txt --document file" "no_text.jsonl"; do
  set -- $empty
  input="$work/$1"
  shift
  for fmt in bin megatron; do
    rc=0
    tokenize --input "$input" "$@" --output "$work/empty/$fmt/corpus" --format "$fmt" 2> "$work/err" || rc=$?
    if [ "$rc" -eq 0 ] || [ -e "$work/empty" ] || ! grep -qF "$input" "$work/err"; then
      echo "$empty ($fmt): exit $rc, wrote" $(find "$work/empty" 2>/dev/null) "and said:"
      cat "$work/err"
      exit 1
    fi
  done
done

# A failed run (an error in an input, a missing input, Ctrl-C or SIGTERM once every file is
# staged) leaves no temporaries, and the corpus an earlier run wrote at its prefix intact.
printf '{"text": "the cat"}\n{"txt": "the dog"}\n' > "$work/bad.jsonl"
interrupted_at_sidecar() {  # the script, with json.dump raising KeyboardInterrupt
  "$python" - "$src/scripts/tokenize_corpus.py" --tokenizer "$work/tok" "$@" <<'EOF'
import json, runpy, sys
def interrupt(*args, **kwargs):
    raise KeyboardInterrupt
json.dump = interrupt
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
EOF
}
terminated_at_sidecar() {  # the script, sent SIGTERM (as a scheduler stops a job) at the same point
  "$python" - "$src/scripts/tokenize_corpus.py" --tokenizer "$work/tok" "$@" <<'EOF'
import json, os, runpy, signal, sys
def terminate(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
json.dump = terminate
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
EOF
}
fail() {
  case "$1" in
    bad-input) tokenize --batch 1 --input "$work/docs.jsonl" "$work/bad.jsonl" "${@:2}" ;;
    missing-input) tokenize --batch 1 --input "$work/docs.jsonl" "$work/missing.txt" "${@:2}" ;;
    interrupted) interrupted_at_sidecar --input "$work/docs.txt" "${@:2}" ;;
    terminated) terminated_at_sidecar --input "$work/docs.txt" "${@:2}" ;;
  esac
}
for fmt in bin megatron; do
  mkdir -p "$work/again/$fmt"
  cp "$work/$fmt"/corpus.* "$work/again/$fmt/"
  for failing in bad-input missing-input interrupted terminated; do
    rc=0
    fail "$failing" --output "$work/again/$fmt/corpus" --format "$fmt" 2> "$work/err" || rc=$?
    left="$(cd "$work/again/$fmt" && ls)"
    [ "$rc" -ne 0 ] || { echo "$failing ($fmt) did not fail"; exit 1; }
    [ "$left" = "$(cd "$work/$fmt" && ls)" ] || { echo "$failing ($fmt) left" $left; cat "$work/err"; exit 1; }
    for f in "$work/$fmt"/corpus.*; do
      cmp -s "$f" "$work/again/$fmt/${f##*/}" || { echo "$failing ($fmt) changed ${f##*/}"; cat "$work/err"; exit 1; }
    done
  done
done
echo "tokenize_corpus: unreadable dtypes, inputs without text and failed runs write nothing"

if [ ! -x "$bin/hp-train" ]; then
  echo "hp-train is not built in $bin"
  exit 1
fi
vocab="$("$python" -c "import json; print(json.load(open('$work/bin/corpus.json'))['vocab_size'])")"
for data in "$work/bin/corpus.bin" "$work/megatron/corpus"; do
  "$bin/hp-train" --model.dim 32 --model.n_layers 1 --model.n_heads 2 --model.vocab_size "$vocab" \
    --model.max_seq_len 16 --training.seq_len 16 --training.batch_size 4 --training.steps 4 \
    --lr_scheduler.warmup_steps 1 --training.data "$data" --validation.freq 2 --metrics.enable_plot false \
    --job.dump_folder "$work/run" > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
  grep -q "tokenizer $work/tok" "$work/train.log" || { echo "hp-train did not read the sidecar:"; cat "$work/train.log"; exit 1; }
  echo "hp-train on $data: $(grep -m1 -E 'token file|Megatron dataset' "$work/train.log")"
done
