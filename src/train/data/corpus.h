// corpus.h — where hp-train's batches come from, behind one interface: the built-in
// synthetic language (training.data empty), a text file, a flat nanoGPT .bin or a Megatron
// indexed dataset. The Trainer builds its training and validation batches the same way
// whatever training.data holds.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "hyper_parallel_train/config/job_config.h"
#include "train/data/batches.h"
#include "train/data/corpus_identity.h"

namespace hyper_parallel::train {

class TrainingCorpus {
 public:
  virtual ~TrainingCorpus() = default;
  // One line for logs: kind, token counts, vocabulary.
  virtual std::string describe() const = 0;
  // Data-parallel rank dp_rank's rows of every step's training / validation batch
  // (training.batch_size rows of training.seq_len tokens in all); the two never share a
  // token window.
  virtual std::shared_ptr<const BatchSource> train_batches(int64_t dp_rank, int64_t dp_size) const = 0;
  virtual std::shared_ptr<const BatchSource> validation_batches(int64_t dp_rank, int64_t dp_size) const = 0;
  // The record of a pre-tokenized corpus's files for the checkpoint's data identity
  // (data_identity.h; hashes every file); nullopt for the corpora training.data and the
  // seed identify.
  virtual std::optional<CorpusIdentity> identity() const { return std::nullopt; }
};

// The corpus `training` names (training.data, data_format, eos_id, bos_id), with ids below
// vocab_size. Each split needs at least one window of seq_len + 1 tokens. Throws c10::Error
// naming the file and what is wrong with it.
std::unique_ptr<const TrainingCorpus> open_training_corpus(const TrainingConfig& training, int64_t vocab_size);

}  // namespace hyper_parallel::train
