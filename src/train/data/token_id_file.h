// A corpus's token ids in an unlinked temporary file, mapped into memory: the ids live on
// disk and in the page cache (evictable, paged in as batches sample them), not on the
// process's heap, so memory does not grow with the corpus. The file is unlinked as soon as
// it is created: nothing is left behind, even when the process is killed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hyper_parallel::train {

class TokenIdFile {
 public:
  // In $TMPDIR (default /tmp); `what` names the corpus in errors.
  explicit TokenIdFile(std::string what);
  ~TokenIdFile();
  TokenIdFile(const TokenIdFile&) = delete;
  TokenIdFile& operator=(const TokenIdFile&) = delete;

  void append(int64_t id) {
    buffer_.push_back(id);
    if (buffer_.size() == kBlock) flush();
  }
  int64_t size() const { return written_ + static_cast<int64_t>(buffer_.size()); }

  // Calls f(ids, n) on consecutive blocks of ids [0, end); with `rewrite`, what f leaves in
  // the block is written back.
  void for_each_block(int64_t end, bool rewrite, const std::function<void(int64_t* ids, int64_t n)>& f);
  // All ids as an int64 tensor over the file (copy-on-write: writes stay private). The
  // mapping lives as long as the tensor and its views; append is not allowed afterwards.
  at::Tensor map();

 private:
  static constexpr size_t kBlock = 1 << 16;
  void flush();

  std::string what_, path_;
  int fd_ = -1;
  int64_t written_ = 0;
  std::vector<int64_t> buffer_;
};

}  // namespace hyper_parallel::train
