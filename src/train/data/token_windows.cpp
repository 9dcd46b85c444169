// TokenWindows: one permutation evaluation and one read of seq_len + 1 tokens per row.
#include "train/data/token_windows.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <vector>

#include "train/data/window_permutation.h"

namespace hyper_parallel::train {
namespace {

// A key per (seed, epoch): nearby epochs get unrelated orders.
uint64_t epoch_key(uint64_t seed, uint64_t epoch) {
  return seed * 0x9E3779B97F4A7C15ull ^ (epoch + 1) * 0xD6E8FEB86659FD93ull;
}

}  // namespace

TokenWindows::TokenWindows(std::shared_ptr<const TokenDocuments> tokens, int64_t begin, int64_t end, int64_t batch_size,
                           int64_t seq_len, uint64_t seed, int64_t dp_rank, int64_t dp_size)
    : tokens_(std::move(tokens)), begin_(begin), batch_size_(batch_size), seq_len_(seq_len), seed_(seed) {
  TORCH_CHECK(tokens_, "TokenWindows: expected documents");
  TORCH_CHECK(batch_size > 0 && seq_len > 0, "TokenWindows: batch_size and seq_len must be > 0, got ", batch_size,
              " and ", seq_len);
  TORCH_CHECK(0 <= begin && begin <= end && end <= tokens_->size(), "TokenWindows: tokens [", begin, ", ", end,
              ") are outside the stream of ", tokens_->size());
  TORCH_CHECK(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size, "TokenWindows: expected 0 <= dp_rank < dp_size, got ",
              dp_rank, " and ", dp_size);
  TORCH_CHECK(batch_size % dp_size == 0, "TokenWindows: batch_size ", batch_size,
              " must be divisible by the data-parallel size ", dp_size);
  windows_ = (end - begin - 1) / seq_len;
  TORCH_CHECK(windows_ >= 1, "'", tokens_->path(), "': tokens [", begin, ", ", end, ") of the stream are ", end - begin,
              ", too few for one window of seq_len + 1 = ", seq_len + 1, " tokens");
  rows_ = batch_size / dp_size;
  first_row_ = dp_rank * rows_;
}

int64_t TokenWindows::window_start(int64_t sample) const {
  TORCH_CHECK(sample >= 0, "TokenWindows: sample must be >= 0, got ", sample);
  const auto w = static_cast<uint64_t>(windows_);
  const auto k = static_cast<uint64_t>(sample);
  const WindowPermutation order(w, epoch_key(seed_, k / w));
  return begin_ + static_cast<int64_t>(order(k % w)) * seq_len_;
}

Batch TokenWindows::batch_at(int64_t step) const {
  TORCH_CHECK(step >= 0, "TokenWindows: step must be >= 0, got ", step);
  TORCH_CHECK(step <= (INT64_MAX - batch_size_) / batch_size_, "TokenWindows: step ", step, " is too large");
  at::Tensor input = at::empty({rows_, seq_len_}, at::kLong);
  at::Tensor target = at::empty({rows_, seq_len_}, at::kLong);
  std::vector<int64_t> window(static_cast<size_t>(seq_len_ + 1));
  int64_t* in = input.data_ptr<int64_t>();
  int64_t* tg = target.data_ptr<int64_t>();
  const auto row_bytes = static_cast<size_t>(seq_len_) * sizeof(int64_t);
  for (int64_t r = 0; r < rows_; ++r) {
    tokens_->read(window_start(step * batch_size_ + first_row_ + r), seq_len_ + 1, window.data());
    std::memcpy(in + r * seq_len_, window.data(), row_bytes);
    std::memcpy(tg + r * seq_len_, window.data() + 1, row_bytes);
  }
  return {input, target};
}

}  // namespace hyper_parallel::train
