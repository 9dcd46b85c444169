// The three kinds of corpus behind TrainingCorpus. Validation batches are drawn with their
// own seed (training.seed + 1, or the synthetic language's validation split), so they are
// never the training batches of the same step.
#include "train/data/corpus.h"

#include <c10/util/Exception.h>

#include "train/data/pretokenized_corpus.h"

namespace hyper_parallel::train {
namespace {

// Generated per batch: memory and start-up do not depend on training.steps.
class SyntheticCorpus final : public TrainingCorpus {
 public:
  SyntheticCorpus(const TrainingConfig& t, int64_t vocab_size) : t_(t), vocab_size_(vocab_size) {}
  // Said without building the language: its tables are O(vocab).
  std::string describe() const override {
    return "synthetic corpus (Zipf-Markov with phrases, seed " + std::to_string(t_.seed) +
           "), generated per batch: " + std::to_string(t_.batch_size) + " rows of " + std::to_string(t_.seq_len + 1) +
           " tokens per step, vocab " + std::to_string(vocab_size_);
  }
  std::shared_ptr<const BatchSource> train_batches(int64_t dp_rank, int64_t dp_size) const override {
    return stream(0, dp_rank, dp_size);
  }
  std::shared_ptr<const BatchSource> validation_batches(int64_t dp_rank, int64_t dp_size) const override {
    return stream(1, dp_rank, dp_size);
  }

 private:
  std::shared_ptr<const SyntheticBatchStream> stream(uint64_t split, int64_t dp_rank, int64_t dp_size) const {
    return std::make_shared<SyntheticBatchStream>(vocab_size_, t_.batch_size, t_.seq_len,
                                                  static_cast<uint64_t>(t_.seed), split, dp_rank, dp_size);
  }
  TrainingConfig t_;
  int64_t vocab_size_;
};

// A text file tokenized at word level, held as token ids (make_text_file_corpus).
class TextCorpus final : public TrainingCorpus {
 public:
  TextCorpus(const TrainingConfig& t, int64_t vocab_size)
      : t_(t), tokens_(make_text_file_corpus(t.data, vocab_size, t.seq_len + 1)) {}
  std::string describe() const override { return tokens_->describe(); }
  std::shared_ptr<const BatchSource> train_batches(int64_t dp_rank, int64_t dp_size) const override {
    return windows(tokens_->train_tokens(), 0, dp_rank, dp_size);
  }
  std::shared_ptr<const BatchSource> validation_batches(int64_t dp_rank, int64_t dp_size) const override {
    return windows(tokens_->validation_tokens(), 1, dp_rank, dp_size);
  }

 private:
  std::shared_ptr<const BatchSource> windows(const at::Tensor& tokens, int64_t seed_offset, int64_t dp_rank,
                                             int64_t dp_size) const {
    auto global =
        std::make_shared<BatchSampler>(tokens, t_.batch_size, t_.seq_len, static_cast<uint64_t>(t_.seed + seed_offset));
    return std::make_shared<ReplicaRows>(std::move(global), dp_rank, dp_size);
  }
  TrainingConfig t_;
  std::unique_ptr<TokenCorpus> tokens_;
};

// Token ids already on disk: a flat .bin or a Megatron dataset (pretokenized_corpus.h).
class TokenFileCorpus final : public TrainingCorpus {
 public:
  TokenFileCorpus(const TrainingConfig& t, const std::string& format, int64_t vocab_size)
      : t_(t), corpus_(PretokenizedCorpusOptions{t.data, format, vocab_size, t.eos_id, t.bos_id, t.seq_len + 1}) {}
  std::string describe() const override { return corpus_.describe(); }
  std::shared_ptr<const BatchSource> train_batches(int64_t dp_rank, int64_t dp_size) const override {
    return corpus_.train_batches(t_.batch_size, t_.seq_len, static_cast<uint64_t>(t_.seed), dp_rank, dp_size);
  }
  std::shared_ptr<const BatchSource> validation_batches(int64_t dp_rank, int64_t dp_size) const override {
    return corpus_.validation_batches(t_.batch_size, t_.seq_len, static_cast<uint64_t>(t_.seed) + 1, dp_rank, dp_size);
  }
  std::optional<CorpusIdentity> identity() const override { return corpus_.identity(); }

 private:
  TrainingConfig t_;
  PretokenizedCorpus corpus_;
};

}  // namespace

std::unique_ptr<const TrainingCorpus> open_training_corpus(const TrainingConfig& training, int64_t vocab_size) {
  if (training.data.empty()) return std::make_unique<SyntheticCorpus>(training, vocab_size);
  const std::string format = resolve_data_format(training.data, training.data_format);
  if (format != "text") return std::make_unique<TokenFileCorpus>(training, format, vocab_size);
  TORCH_CHECK(training.eos_id == -1 && training.bos_id == -1, "hp-train: training.data '", training.data,
              "' is text; training.eos_id / bos_id apply to pre-tokenized corpora only");
  return std::make_unique<TextCorpus>(training, vocab_size);
}

}  // namespace hyper_parallel::train
