// Training windows over pre-tokenized documents, Megatron's way: the stream part
// [begin, end) is cut into W = (end - begin - 1) / seq_len windows of seq_len + 1 tokens,
// window w starting at token w * seq_len (neighbours share one token, so every token
// after the first is a target exactly once per epoch). Global sample k (= step x
// batch_size + row) is window perm_e(k mod W) of epoch e = k / W, perm_e a keyed
// permutation (window_permutation.h) of the seed and the epoch: each epoch visits every
// window once, in a fresh order, and a step's batch is a pure function of (seed, step) —
// a resumed run sees the same batches.
//
// Split for data parallelism like SyntheticBatchStream: rank dp_rank of dp_size reads only
// its rows [dp_rank * batch_size / dp_size, ...) of each global batch, straight from the
// mapped file; no rank reads another's windows or holds the corpus.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "train/data/batches.h"
#include "train/data/token_documents.h"

namespace hyper_parallel::train {

class TokenWindows : public BatchSource {
 public:
  TokenWindows(std::shared_ptr<const TokenDocuments> tokens, int64_t begin, int64_t end, int64_t batch_size,
               int64_t seq_len, uint64_t seed, int64_t dp_rank = 0, int64_t dp_size = 1);
  Batch batch_at(int64_t step) const override;

  int64_t windows_per_epoch() const { return windows_; }
  // The stream token where global sample `sample`'s window starts.
  int64_t window_start(int64_t sample) const;

 private:
  std::shared_ptr<const TokenDocuments> tokens_;
  int64_t begin_, batch_size_, seq_len_, windows_;
  uint64_t seed_;
  int64_t first_row_, rows_;
};

}  // namespace hyper_parallel::train
