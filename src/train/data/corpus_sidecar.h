// The small JSON file scripts/tokenize_corpus.py writes next to a pre-tokenized corpus
// (PREFIX.json beside PREFIX.bin / PREFIX.idx): what the token ids mean, so that a
// corpus is not read with the wrong dtype or trained with a model of too small a
// vocabulary. Every field is optional for a hand-written file; those present are checked.
//   {"format": "bin" | "megatron", "dtype": "uint16", "vocab_size": 50257,
//    "eos_id": 50256, "bos_id": null, "tokenizer": "gpt2",
//    "tokenizer_sha256": "…", "documents": 1000, "tokens": 123456}
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace hyper_parallel::train {

struct CorpusSidecar {
  std::string path;         // where it was read from
  std::string format;       // "bin" or "megatron"; "" when absent
  std::string dtype;        // numpy name; "" when absent
  int64_t vocab_size = -1;  // the tokenizer's; -1 when absent
  int64_t eos_id = -1;      // -1 when absent or null
  int64_t bos_id = -1;
  std::string tokenizer;         // the tokenizer's name or path, as given to the script
  std::string tokenizer_sha256;  // of its tokenizer.json (or model file)
  int64_t documents = -1;
  int64_t tokens = -1;
};

// PREFIX of a corpus path: a trailing ".bin" / ".idx" stripped.
std::string corpus_prefix(const std::string& corpus_path);
// PREFIX.json for a corpus path.
std::string sidecar_path_for(const std::string& corpus_path);
// The sidecar of `corpus_path`, or nullopt when there is none. Throws c10::Error naming
// the file and field when it is not JSON, a field has the wrong type, or an id is negative.
std::optional<CorpusSidecar> read_corpus_sidecar(const std::string& corpus_path);

}  // namespace hyper_parallel::train
