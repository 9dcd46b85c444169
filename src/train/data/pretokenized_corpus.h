// training.data when it holds token ids rather than text: a flat nanoGPT file
// (flat_token_file.h) or a Megatron indexed dataset (megatron_indexed_dataset.h), with
// its sidecar (corpus_sidecar.h) when there is one. The stream's first 90% of tokens
// train, the last 10% validate; both are read as TokenWindows per data-parallel rank.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "train/data/corpus_identity.h"
#include "train/data/corpus_sidecar.h"
#include "train/data/batches.h"
#include "train/data/token_documents.h"

namespace hyper_parallel::train {

// training.data_format for `path`: "text", "bin_u16", "bin_u32" or "megatron". With
// "auto": PREFIX.idx, or PREFIX.bin / PREFIX beside a PREFIX.idx, is Megatron; another
// .bin is flat, its dtype from the sidecar (an error without one: uint16 and uint32 files
// look alike); anything else is text. Throws c10::Error naming the path.
std::string resolve_data_format(const std::string& path, const std::string& requested);

struct PretokenizedCorpusOptions {
  std::string path;
  std::string format = "auto";   // as training.data_format
  int64_t vocab_size = 0;        // the model's: every id must be below it
  int64_t eos_id = -1;           // -1: the sidecar's
  int64_t bos_id = -1;           // -1: the sidecar's
  int64_t min_split_tokens = 2;  // each of train / validation needs this many (seq_len + 1)
};

class PretokenizedCorpus {
 public:
  // Opens and checks the files (not a text format: resolve_data_format first). A Megatron
  // dataset needs an EOS id (options or sidecar): its documents are separated by it.
  explicit PretokenizedCorpus(const PretokenizedCorpusOptions& options);

  const std::shared_ptr<const TokenDocuments>& tokens() const { return tokens_; }
  // Stream tokens [0, train_end()) train, [train_end(), tokens()->size()) validate.
  int64_t train_end() const { return train_end_; }
  const std::string& format() const { return format_; }
  const std::optional<CorpusSidecar>& sidecar() const { return sidecar_; }
  std::string describe() const;
  // Hashes every file of the corpus (reads it once).
  CorpusIdentity identity() const;

  // This data-parallel rank's rows of the training / validation windows.
  std::shared_ptr<const BatchSource> train_batches(int64_t batch_size, int64_t seq_len, uint64_t seed, int64_t dp_rank,
                                                   int64_t dp_size) const;
  std::shared_ptr<const BatchSource> validation_batches(int64_t batch_size, int64_t seq_len, uint64_t seed,
                                                        int64_t dp_rank, int64_t dp_size) const;

 private:
  PretokenizedCorpusOptions options_;
  std::string format_, prefix_;
  std::optional<CorpusSidecar> sidecar_;
  DocumentSeparators separators_;
  std::shared_ptr<const TokenDocuments> tokens_;
  int64_t train_end_ = 0;
};

}  // namespace hyper_parallel::train
