// Training data for hp-train: token corpora (a built-in deterministic synthetic
// one that needs no download, and a user's text file) and a deterministic,
// resumable batch sampler.
//
// Everything here is reproducible from explicit seeds and never touches the
// global RNG: tensor-parallel ranks run as threads in tests, and every rank
// must see exactly the same batches, also after a resume.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "hyper_parallel_train/data/batch.h"

namespace hyper_parallel::train {

// A long 1-D int64 token stream split into a training part and a validation
// part that do not overlap.
class TokenCorpus {
 public:
  virtual ~TokenCorpus() = default;
  // Size of the id space (embedding / logits width); every id is < this.
  virtual int64_t vocab_size() const = 0;
  virtual const at::Tensor& train_tokens() const = 0;       // int64 1-D
  virtual const at::Tensor& validation_tokens() const = 0;  // int64 1-D, disjoint from train
  // One line for logs: kind, token counts, vocabulary.
  virtual std::string describe() const = 0;
};

// Defaults hp-train uses for the built-in corpus.
constexpr int64_t kDefaultSyntheticVocab = 32000;
constexpr int64_t kDefaultSyntheticTokens = 2'000'000;

// Built-in synthetic corpus ("Zipf-Markov with phrases"), fully determined by
// (vocab_size, num_tokens, seed). Design:
//  * Unigram base: Zipf-Mandelbrot over frequency ranks, p(r) ~ 1 / (r + 2.7)^1.05.
//    Ranks are mapped to ids through a seeded permutation, so frequent tokens are
//    spread over the id space (each shard of a vocab-parallel embedding sees a
//    similar share of the traffic, as with a real tokenizer).
//  * Sparse first-order Markov chain: every token has 4 successors drawn from the
//    Zipf base, taken with probabilities 0.55 / 0.25 / 0.12 / 0.08.
//  * Phrases: 2048 fixed sequences of 3-8 tokens (themselves Zipf-drawn), chosen
//    Zipf-like among themselves; one starts with probability 0.06 at each step.
//  * Noise: with probability 0.10 the next token is a fresh draw from a flatter
//    Zipf (exponent 0.7), which keeps the chain ergodic and brings in the long
//    tail of the vocabulary.
// Measured (V = 32000, 2M tokens, seed 0): most frequent token 4.5% of the stream,
// rank-frequency slope ~ -1.2, ~92% of the ids occur, unigram entropy ~6.5 nats
// vs ln(V) = 10.37, plug-in H(next | current) ~2.3 nats.
// Each step is therefore mostly predictable from the previous token: the
// conditional entropy H(next | current) is a few nats, far below both the
// unigram entropy and ln(vocab_size), so a small LM's loss drops quickly from
// ln(vocab) (unigram first, then bigram structure).
// The first 90% of the stream is the training part, the last 10% validation.
// Needs vocab_size >= 64 and num_tokens >= 100; 2M tokens take ~0.1 s.
std::unique_ptr<TokenCorpus> make_synthetic_corpus(int64_t vocab_size = kDefaultSyntheticVocab,
                                                   int64_t num_tokens = kDefaultSyntheticTokens, uint64_t seed = 0);

// A user's text file, tokenized at word level: ASCII is lowercased; a word is a
// run of letters / digits / non-ASCII bytes (UTF-8 words stay whole), with an
// apostrophe kept inside a word ("don't"); every other visible character is a
// token of its own (punctuation); whitespace and control characters separate.
// The first 90% of the tokens train, the last 10% validate. The vocabulary is
// the vocab_size - 2 most frequent words of the training part (ties broken
// alphabetically), ids 2.. in that order; id 0 = <pad>, id 1 = <unk> (every
// other word, including validation words unseen in training). vocab_size()
// is the requested vocab_size even when the file has fewer distinct words, so
// the model shape (and its divisibility by the TP size) does not depend on it.
// Throws (c10::Error, naming the file) when the file cannot be read, is not text (a
// NUL byte, or bytes that are not UTF-8: the offset is named), or when the
// training or validation part has fewer than min_split_tokens tokens; hp-train
// passes seq_len + 1, the length of one window of a batch.
std::unique_ptr<TokenCorpus> make_text_file_corpus(const std::string& path, int64_t vocab_size,
                                                   int64_t min_split_tokens = 2);

// The built-in synthetic language (same tables as make_synthetic_corpus), generated per
// batch instead of held: every row of every step is a fresh walk of seq_len + 1 tokens
// seeded by (seed, split, step, global row), so memory is the language's tables (O(vocab),
// ~2 MB for 32000) whatever training.steps is, and batch_at(10^9) costs what batch_at(0)
// does. split 0 is training, 1 validation (different walks). Sharded for data
// parallelism: rank dp_rank of dp_size generates only its batch_size / dp_size rows of
// the global batch (rows dp_rank * batch_size / dp_size ...).
class SyntheticBatchStream : public BatchSource {
 public:
  SyntheticBatchStream(int64_t vocab_size, int64_t batch_size, int64_t seq_len, uint64_t seed, uint64_t split,
                       int64_t dp_rank = 0, int64_t dp_size = 1);
  ~SyntheticBatchStream() override;
  Batch batch_at(int64_t step) const override;

 private:
  struct Language;
  std::unique_ptr<Language> language_;
  int64_t vocab_size_, seq_len_;
  uint64_t seed_, split_;
  int64_t first_row_, rows_;
};

// Random windows of seq_len + 1 consecutive tokens. The batch of a step depends
// only on (seed, step) — not on earlier calls — so a resumed run sees exactly the
// same batches, and every tensor-parallel rank builds the same batch. The tokens
// are shared with the caller (no copy when already contiguous).
class BatchSampler : public BatchSource {
 public:
  BatchSampler(const at::Tensor& tokens, int64_t batch_size, int64_t seq_len, uint64_t seed);

  // int64 CPU tensors [batch_size, seq_len]; step must be >= 0.
  Batch batch_at(int64_t step) const override;

  int64_t batch_size() const { return batch_size_; }
  int64_t seq_len() const { return seq_len_; }

 private:
  at::Tensor tokens_;  // int64 1-D contiguous
  int64_t batch_size_;
  int64_t seq_len_;
  uint64_t seed_;
};

// One data-parallel replica's rows of another source's global batches: rows
// [dp_rank * n / dp_size, (dp_rank + 1) * n / dp_size) of each step (the same split as
// SyntheticBatchStream's). The global batch is still built whole (cheap for token windows).
class ReplicaRows : public BatchSource {
 public:
  ReplicaRows(std::shared_ptr<const BatchSource> global, int64_t dp_rank, int64_t dp_size);
  Batch batch_at(int64_t step) const override;

 private:
  std::shared_ptr<const BatchSource> global_;
  int64_t dp_rank_, dp_size_;
};

// Micro-batch `index` of `count` of a batch: rows [index * n / count, ...) as views.
// Throws when the rows do not split evenly.
Batch micro_batch(const Batch& batch, int64_t index, int64_t count);

}  // namespace hyper_parallel::train
