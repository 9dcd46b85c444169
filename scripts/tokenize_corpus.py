#!/usr/bin/env python3
"""Tokenizes text or JSONL into the pre-tokenized corpora hp-train reads (docs/training.md).

    tokenize_corpus.py --tokenizer DIR_OR_TOKENIZER_JSON --input a.jsonl [b.txt ...] \
                       --output out/corpus [--format bin|megatron]

Writes OUT.bin (and OUT.idx for --format megatron) plus OUT.json, the sidecar hp-train
checks (dtype, vocabulary size, EOS/BOS ids, tokenizer identity, counts). Each file is
written as FILE.tmp and renamed into place once all of them are complete; a failed run
removes its temporaries and leaves any earlier corpus at OUT as it was.
  * bin: nanoGPT's flat file of little-endian ids (uint16 for vocabularies up to 65536,
    else uint32). Boundaries are not recorded, so every document ends with EOS in the
    file (and starts with BOS when one is used).
  * megatron: Megatron-LM's indexed dataset (.bin + .idx, layout in
    src/train/data/megatron_indexed_dataset.h), one sequence per document, uint16 below 65500
    ids else int32 as Megatron chooses; EOS appended as Megatron's --append-eod does.
--dtype takes only the dtypes hp-train reads in that format (HP_TRAIN_DTYPES).

Documents: one per JSONL line (its --jsonl-key field, "text" by default); in a text
file, one per paragraph (blank-line separated; --document line or file to change).
The tokenizer is HF `tokenizers` (a tokenizer.json, or a folder holding one); a folder
without one is loaded with transformers' AutoTokenizer (local files only) when
transformers is installed. Nothing is downloaded.

The writers (FlatWriter, MegatronWriter) use the standard library only, so tests can
write corpora without the tokenizers package.
"""
import argparse
import array
import hashlib
import json
import os
import signal
import struct
import sys

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
# Megatron's DType codes (megatron/core/datasets/indexed_dataset.py).
MEGATRON_DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint16": 8}
# array typecodes of a given size (C sizes checked below).
ARRAY_CODES = {"uint8": "B", "int8": "b", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I", "int64": "q"}
DTYPE_BYTES = {"uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8}
DTYPE_MAX = {"uint8": 255, "int8": 127, "int16": 32767, "uint16": 65535, "int32": 2**31 - 1,
             "uint32": 2**32 - 1, "int64": 2**63 - 1}
# The token dtypes hp-train reads: a flat .bin as bin_u16 / bin_u32 only
# (src/train/data/pretokenized_corpus.cpp), a Megatron dataset in any of Megatron's integer
# codes (src/train/data/megatron_indexed_dataset.cpp). Anything else it refuses.
HP_TRAIN_DTYPES = {"bin": ("uint16", "uint32"), "megatron": ("uint8", "int8", "int16", "uint16", "int32", "int64")}


def _ids_bytes(ids, dtype):
    a = array.array(ARRAY_CODES[dtype], ids)  # OverflowError on an id the dtype cannot hold
    if a.itemsize != DTYPE_BYTES[dtype]:
        raise RuntimeError(f"this Python's array '{ARRAY_CODES[dtype]}' is {a.itemsize} bytes, not {dtype}")
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


class Temporaries:
    """Files written as PATH.tmp and renamed onto PATH only once every one is complete, so
    a reader never sees a half-written file, nor a new .bin beside an old .idx or sidecar."""

    def __init__(self):
        self.files = []  # (open file on PATH.tmp, PATH)

    def open(self, path, mode="wb"):
        f = open(path + ".tmp", mode)
        self.files.append((f, path))
        return f

    def commit(self):
        for f, _ in self.files:
            if not f.closed:
                f.flush()
                os.fsync(f.fileno())  # complete on disk before the rename publishes it
                f.close()
        while self.files:
            f, path = self.files[0]
            os.replace(f.name, path)
            self.files.pop(0)

    def abort(self):
        """Closes and removes every temporary not yet renamed (on any failure)."""
        for f, _ in self.files:
            f.close()
            try:
                os.remove(f.name)
            except FileNotFoundError:
                pass
        self.files = []


class _StagedWriter:
    """finish(): close() completes the writer's temporaries, which are then renamed together."""

    def finish(self):
        try:
            self.close()
            self.temporaries.commit()
        except BaseException:
            self.temporaries.abort()
            raise


class FlatWriter(_StagedWriter):
    """nanoGPT's layout: ids back to back, no header. `temporaries` lets the caller rename
    the .bin together with its sidecar; finish() renames it alone."""

    def __init__(self, prefix, dtype, temporaries=None):
        if dtype not in HP_TRAIN_DTYPES["bin"]:
            raise ValueError(f"hp-train reads no flat {dtype} file")
        self.bin_path = prefix + ".bin"
        self.dtype = dtype
        self.tokens = 0
        self.documents = 0
        self.temporaries = temporaries if temporaries is not None else Temporaries()
        self.out = self.temporaries.open(self.bin_path)

    def add_document(self, ids):
        self.out.write(_ids_bytes(ids, self.dtype))
        self.tokens += len(ids)
        self.documents += 1

    def close(self):
        """Completes the temporaries (renamed by temporaries.commit())."""
        self.out.close()


class MegatronWriter(_StagedWriter):
    """Megatron's IndexedDatasetBuilder layout, one sequence per document."""

    def __init__(self, prefix, dtype, temporaries=None):
        if dtype not in MEGATRON_DTYPE_CODES:
            raise ValueError(f"Megatron has no dtype code for {dtype}")
        self.bin_path = prefix + ".bin"
        self.idx_path = prefix + ".idx"
        self.dtype = dtype
        self.lengths = array.array("q")
        self.document_indices = array.array("q", [0])
        self.tokens = 0
        self.temporaries = temporaries if temporaries is not None else Temporaries()
        self.out = self.temporaries.open(self.bin_path)

    @property
    def documents(self):
        return len(self.document_indices) - 1

    def add_sequence(self, ids):
        """A sequence of the current document (Megatron's add_item)."""
        self.out.write(_ids_bytes(ids, self.dtype))
        self.lengths.append(len(ids))
        self.tokens += len(ids)

    def end_document(self):
        self.document_indices.append(len(self.lengths))

    def add_document(self, ids):
        self.add_sequence(ids)
        self.end_document()

    def close(self):
        """Completes the temporaries, .idx included (renamed by temporaries.commit())."""
        self.out.close()
        item = DTYPE_BYTES[self.dtype]
        pointers, offset = array.array("q"), 0
        for n in self.lengths:
            pointers.append(offset)
            offset += n * item
        f = self.temporaries.open(self.idx_path)
        f.write(MEGATRON_MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", MEGATRON_DTYPE_CODES[self.dtype]))
        f.write(struct.pack("<Q", len(self.lengths)))
        f.write(struct.pack("<Q", len(self.document_indices)))
        f.write(_ids_bytes(self.lengths, "int32"))
        f.write(_ids_bytes(pointers, "int64"))
        f.write(_ids_bytes(self.document_indices, "int64"))
        f.close()


def flat_dtype(vocab_size):
    return "uint16" if vocab_size <= 65536 else "uint32"


def megatron_dtype(vocab_size):
    return "uint16" if vocab_size < 65500 else "int32"  # Megatron's DType.optimal_dtype


def write_sidecar(prefix, fmt, writer, vocab_size, eos_id, bos_id, tokenizer_name="", tokenizer_sha256="",
                  temporaries=None):
    """Writes PREFIX.json: renamed into place at once, or by `temporaries`' commit()."""
    sidecar = {
        "format": fmt,
        "dtype": writer.dtype,
        "vocab_size": vocab_size,
        "eos_id": eos_id,
        "bos_id": bos_id,
        "tokenizer": tokenizer_name,
        "tokenizer_sha256": tokenizer_sha256,
        "documents": writer.documents,
        "tokens": writer.tokens,
    }
    staged = temporaries if temporaries is not None else Temporaries()
    try:
        f = staged.open(prefix + ".json", "w")
        json.dump(sidecar, f, indent=2)
        f.write("\n")
        if temporaries is None:
            staged.commit()
    except BaseException:
        staged.abort()
        raise
    return sidecar


# ---------------------------------------------------------------------------------------
# Tokenizer and documents
# ---------------------------------------------------------------------------------------

class HFTokenizer:
    """A tokenizer.json through `tokenizers`, or a folder through transformers."""

    def __init__(self, path):
        self.name = path
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        json_path = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        self.config = {}
        config_path = os.path.join(folder, "tokenizer_config.json")
        if os.path.isfile(config_path):
            with open(config_path) as f:
                self.config = json.load(f)
        if os.path.isfile(json_path):
            from tokenizers import Tokenizer  # noqa: imported here: the writers need no package
            self.tok = Tokenizer.from_file(json_path)
            self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
            self.identity_file = json_path
            self.encode_batch = lambda texts: [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]
            self.token_to_id = self.tok.token_to_id
        else:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                sys.exit(f"tokenize_corpus: {path} holds no tokenizer.json, and transformers (needed for other "
                         "tokenizer folders) is not installed")
            self.tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
            self.vocab_size = len(self.tok)
            model_files = [n for n in ("tokenizer.model", "vocab.json", "spiece.model") if
                           os.path.isfile(os.path.join(folder, n))]
            self.identity_file = os.path.join(folder, model_files[0]) if model_files else None
            self.encode_batch = lambda texts: self.tok(texts, add_special_tokens=False)["input_ids"]
            self.token_to_id = lambda t: self.tok.convert_tokens_to_ids(t) if t in self.tok.get_vocab() else None

    def sha256(self):
        if not self.identity_file:
            return ""
        h = hashlib.sha256()
        with open(self.identity_file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    def configured_token(self, key):
        value = self.config.get(key)
        return value.get("content") if isinstance(value, dict) else value

    def special_id(self, explicit, config_key, fallbacks, what):
        """The id of `explicit`, else the tokenizer_config's token, else the first known fallback."""
        candidates = [explicit] if explicit else [self.configured_token(config_key)] + list(fallbacks)
        for token in candidates:
            if token:
                i = self.token_to_id(token)
                if i is not None:
                    return i
                if explicit:
                    sys.exit(f"tokenize_corpus: {what} token {token!r} is not in the tokenizer's vocabulary")
        return None


def documents(paths, jsonl_key, mode):
    """Yields each document's text."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            if path.endswith(".jsonl") or path.endswith(".json"):
                for n, line in enumerate(f, 1):
                    if line.strip():
                        record = json.loads(line)
                        if jsonl_key not in record:
                            sys.exit(f"tokenize_corpus: {path}:{n} has no {jsonl_key!r} field")
                        yield record[jsonl_key]
            elif mode == "file":
                yield f.read()
            elif mode == "line":
                for line in f:
                    if line.strip():
                        yield line.rstrip("\n")
            else:
                paragraph = []
                for line in f:
                    if line.strip():
                        paragraph.append(line)
                    elif paragraph:
                        yield "".join(paragraph).rstrip("\n")
                        paragraph = []
                if paragraph:
                    yield "".join(paragraph).rstrip("\n")


def batches(iterable, n):
    batch = []
    for x in iterable:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer", required=True, help="tokenizer.json, or a folder with the tokenizer's files")
    p.add_argument("--input", required=True, nargs="+", help=".jsonl / .json (one record per line) or text files")
    p.add_argument("--output", required=True, help="output prefix: writes PREFIX.bin (+ .idx) and PREFIX.json")
    p.add_argument("--format", choices=["bin", "megatron"], default="bin")
    readable_anywhere = [d for d in ARRAY_CODES if any(d in v for v in HP_TRAIN_DTYPES.values())]
    p.add_argument("--dtype", choices=["auto"] + readable_anywhere, default="auto",
                   help="what hp-train reads: bin uint16 or uint32; megatron uint8, int8, int16, uint16, int32 or "
                   "int64 (default: uint16 for small vocabularies, else uint32 for bin, int32 for megatron)")
    p.add_argument("--jsonl-key", default="text")
    p.add_argument("--document", choices=["paragraph", "line", "file"], default="paragraph",
                   help="what a document is in a text file")
    p.add_argument("--eos-token", help="end-of-document token (default: tokenizer_config.json's eos_token, "
                   "else <|endoftext|>, </s>, <|end_of_text|>, <eos>)")
    p.add_argument("--bos-token", help="also start every document with this token (default: tokenizer_config's "
                   "bos_token when it sets add_bos_token)")
    p.add_argument("--batch", type=int, default=1000, help="documents per encode_batch call")
    args = p.parse_args()
    # Refused before the tokenizer is loaded: a corpus hp-train cannot read is no use.
    readable = HP_TRAIN_DTYPES[args.format]
    if args.dtype != "auto" and args.dtype not in readable:
        p.error(f"argument --dtype: hp-train reads --format {args.format} only as "
                f"{', '.join(readable[:-1])} or {readable[-1]}, not {args.dtype}")

    tok = HFTokenizer(args.tokenizer)
    eos = tok.special_id(args.eos_token, "eos_token", ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"], "EOS")
    if eos is None:
        sys.exit("tokenize_corpus: no end-of-document token found in the tokenizer; pass --eos-token")
    bos = None
    if args.bos_token or tok.config.get("add_bos_token"):
        bos = tok.special_id(args.bos_token, "bos_token", [], "BOS")
        if bos is None:
            sys.exit("tokenize_corpus: tokenizer_config.json sets add_bos_token but names no known bos_token")

    dtype = args.dtype if args.dtype != "auto" else (
        flat_dtype(tok.vocab_size) if args.format == "bin" else megatron_dtype(tok.vocab_size))
    if tok.vocab_size - 1 > DTYPE_MAX[dtype]:
        sys.exit(f"tokenize_corpus: --dtype {dtype} cannot hold ids up to {tok.vocab_size - 1}")
    out_dir = os.path.dirname(os.path.abspath(args.output))
    created_dirs = []  # innermost first, removed again on failure
    d = out_dir
    while not os.path.exists(d):
        created_dirs.append(d)
        d = os.path.dirname(d)
    staged = Temporaries()
    try:
        os.makedirs(out_dir, exist_ok=True)
        writer = (FlatWriter if args.format == "bin" else MegatronWriter)(args.output, dtype, staged)
        text_tokens = 0  # ids from the documents' text, before BOS / EOS are added
        for texts in batches(documents(args.input, args.jsonl_key, args.document), args.batch):
            for ids in tok.encode_batch(texts):
                ids = list(ids)
                text_tokens += len(ids)
                if bos is not None and (not ids or ids[0] != bos):
                    ids.insert(0, bos)
                if not ids or ids[-1] != eos:
                    ids.append(eos)
                writer.add_document(ids)
        if text_tokens == 0:
            # Separators alone (or an empty file) are no corpus: refuse rather than write one.
            n = writer.documents
            what = "no documents" if n == 0 else f"{n} document{'s' if n > 1 else ''}, none with a token"
            sys.exit(f"tokenize_corpus: no text to tokenize in {', '.join(args.input)} ({what}); nothing written")
        writer.close()
        sidecar = write_sidecar(args.output, args.format, writer, tok.vocab_size, eos, bos, tok.name, tok.sha256(),
                                staged)
        staged.commit()
    except BaseException:
        staged.abort()
        for d in created_dirs:
            try:
                os.rmdir(d)
            except OSError:
                break
        raise
    print(f"tokenize_corpus: {sidecar['documents']} documents, {sidecar['tokens']} tokens ({dtype}) -> "
          f"{args.output}.bin{' + .idx' if args.format == 'megatron' else ''} + {args.output}.json")


class Terminated(BaseException):
    """SIGTERM (a scheduler stopping the job), raised where the run is, so that its
    temporaries are removed as for any other failure."""


def _raise_terminated(signum, frame):
    raise Terminated()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        main()
    except KeyboardInterrupt:
        print("tokenize_corpus: interrupted; its temporaries are removed", file=sys.stderr)
        sys.exit(130)
    except Terminated:
        print("tokenize_corpus: terminated (SIGTERM); its temporaries are removed", file=sys.stderr)
        sys.exit(143)
