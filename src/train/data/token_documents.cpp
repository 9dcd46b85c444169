// TokenDocuments: the separator layout is computed once (one pass over the documents);
// a read binary-searches its first document and then walks documents forward.
#include "train/data/token_documents.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "io/mapped_file.h"

namespace hyper_parallel::train {
namespace {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian; a big-endian host would need byte swaps here");

constexpr uint8_t kBos = 1;
constexpr uint8_t kEos = 2;

template <class T>
int64_t load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return static_cast<int64_t>(v);
}

// Calls f.template operator()<T>() with the C++ type stored as `dtype`.
template <class F>
auto visit_dtype(TokenDtype dtype, F&& f) {
  switch (dtype) {
    case TokenDtype::kUInt8:
      return f.template operator()<uint8_t>();
    case TokenDtype::kInt8:
      return f.template operator()<int8_t>();
    case TokenDtype::kInt16:
      return f.template operator()<int16_t>();
    case TokenDtype::kUInt16:
      return f.template operator()<uint16_t>();
    case TokenDtype::kInt32:
      return f.template operator()<int32_t>();
    case TokenDtype::kUInt32:
      return f.template operator()<uint32_t>();
    case TokenDtype::kInt64:
      return f.template operator()<int64_t>();
  }
  TORCH_CHECK(false, "unknown token dtype");
}

}  // namespace

int64_t token_dtype_size(TokenDtype dtype) {
  return visit_dtype(dtype, []<class T>() { return static_cast<int64_t>(sizeof(T)); });
}

std::string token_dtype_name(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUInt8:
      return "uint8";
    case TokenDtype::kInt8:
      return "int8";
    case TokenDtype::kInt16:
      return "int16";
    case TokenDtype::kUInt16:
      return "uint16";
    case TokenDtype::kInt32:
      return "int32";
    case TokenDtype::kUInt32:
      return "uint32";
    case TokenDtype::kInt64:
      return "int64";
  }
  return "?";
}

const std::string& TokenDocuments::path() const { return file_->path(); }

TokenDocuments::TokenDocuments(std::shared_ptr<const io::MappedFile> file, TokenDtype dtype,
                               std::vector<int64_t> doc_starts, DocumentSeparators separators, int64_t vocab_size)
    : file_(std::move(file)),
      dtype_(dtype),
      separators_(separators),
      vocab_size_(vocab_size),
      file_start_(std::move(doc_starts)) {
  TORCH_CHECK(file_, "TokenDocuments: expected a file");
  TORCH_CHECK(vocab_size_ > 0, "TokenDocuments: vocab_size must be > 0, got ", vocab_size_);
  TORCH_CHECK(!file_start_.empty() && file_start_.front() == 0, "'", path(),
              "': document starts must begin at token 0");
  const int64_t tokens_in_file = file_->size() / token_dtype_size(dtype_);
  TORCH_CHECK(file_start_.back() <= tokens_in_file, "'", path(), "': documents end at token ", file_start_.back(),
              " but the file holds ", tokens_in_file, " ", token_dtype_name(dtype_), " tokens");
  for (const int64_t id : {separators_.bos_id, separators_.eos_id}) {
    TORCH_CHECK(id >= -1 && id < vocab_size_, "'", path(), "': separator id ", id, " is outside the vocabulary [0, ",
                vocab_size_, ")");
  }
  const size_t docs = file_start_.size() - 1;
  added_.assign(docs, 0);
  virtual_start_.assign(docs + 1, 0);
  for (size_t d = 0; d < docs; ++d) {
    const int64_t a = file_start_[d], b = file_start_[d + 1];
    TORCH_CHECK(a <= b, "'", path(), "': document ", d, " ends (token ", b, ") before it starts (token ", a, ")");
    // An empty document contributes nothing, not a lone separator.
    if (b > a) {
      if (separators_.bos_id >= 0 && file_token(a) != separators_.bos_id) added_[d] |= kBos;
      if (separators_.eos_id >= 0 && file_token(b - 1) != separators_.eos_id) added_[d] |= kEos;
    }
    virtual_start_[d + 1] = virtual_start_[d] + (b - a) + ((added_[d] & kBos) ? 1 : 0) + ((added_[d] & kEos) ? 1 : 0);
  }
}

int64_t TokenDocuments::file_token(int64_t index) const {
  int64_t id = 0;
  read_file_tokens(index, 1, &id);
  return id;
}

void TokenDocuments::read_file_tokens(int64_t begin, int64_t n, int64_t* out) const {
  const unsigned char* base = file_->data();
  visit_dtype(dtype_, [&]<class T>() {
    const unsigned char* p = base + begin * static_cast<int64_t>(sizeof(T));
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = load<T>(p + i * static_cast<int64_t>(sizeof(T)));
      out[i] = v;
      ok &= (v >= 0) & (v < vocab_size_);
    }
    if (ok) return;
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(out[i] >= 0 && out[i] < vocab_size_, "'", path(), "': token ", begin + i, " (byte offset ",
                  (begin + i) * static_cast<int64_t>(sizeof(T)), ") is id ", out[i], ", outside the vocabulary [0, ",
                  vocab_size_,
                  "); was the corpus tokenized for this "
                  "model.vocab_size, and is its dtype (",
                  token_dtype_name(dtype_), ") right?");
    }
  });
}

void TokenDocuments::check_every_id(int64_t limit, const std::string& limit_name) const {
  const unsigned char* base = file_->data();
  const int64_t tokens = file_tokens();
  visit_dtype(dtype_, [&]<class T>() {
    // Blocks of 64 Ki tokens: a branch-free min / max the compiler vectorises, then, only
    // in a block that holds a bad id, the scan that finds it.
    constexpr int64_t kBlock = 1 << 16;
    for (int64_t begin = 0; begin < tokens; begin += kBlock) {
      const int64_t n = std::min(kBlock, tokens - begin);
      const unsigned char* p = base + begin * static_cast<int64_t>(sizeof(T));
      T lo = std::numeric_limits<T>::max(), hi = std::numeric_limits<T>::lowest();
      auto take = [&](int64_t i) {
        T v;
        std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
      };
      // Runs of a fixed length: GCC's -O2 vectorises only loops without a remainder (3x).
      constexpr int64_t kRun = 64;
      int64_t i = 0;
      for (; i + kRun <= n; i += kRun) {
        for (int64_t j = 0; j < kRun; ++j) take(i + j);
      }
      for (; i < n; ++i) take(i);
      if (static_cast<int64_t>(lo) >= 0 && static_cast<int64_t>(hi) < limit) continue;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = load<T>(p + i * static_cast<int64_t>(sizeof(T)));
        TORCH_CHECK(v >= 0 && v < limit, "'", path(), "': token ", begin + i, " (byte offset ",
                    (begin + i) * static_cast<int64_t>(sizeof(T)), ") is id ", v, ", outside [0, ", limit, ") (",
                    limit_name, "); was the corpus tokenized for this vocabulary, and is its dtype (",
                    token_dtype_name(dtype_), ") right?");
      }
    }
  });
}

void TokenDocuments::read(int64_t begin, int64_t n, int64_t* out) const {
  TORCH_CHECK(begin >= 0 && n >= 0 && begin + n <= size(), "'", path(), "': tokens [", begin, ", ", begin + n,
              ") are outside the stream of ", size(), " tokens");
  // The document holding `begin`: the last one whose stream start is <= begin.
  auto d = static_cast<size_t>(std::upper_bound(virtual_start_.begin(), virtual_start_.end(), begin) -
                               virtual_start_.begin() - 1);
  int64_t pos = begin;
  const int64_t end = begin + n;
  while (pos < end) {
    while (virtual_start_[d + 1] <= pos) ++d;  // skips empty documents
    const bool bos = (added_[d] & kBos) != 0;
    int64_t o = pos - virtual_start_[d];  // offset within the document's stream part
    if (bos && o == 0) {
      *out++ = separators_.bos_id;
      ++pos;
      continue;
    }
    const int64_t body = file_start_[d + 1] - file_start_[d];
    o -= bos ? 1 : 0;
    if (o < body) {
      const int64_t take = std::min(body - o, end - pos);
      read_file_tokens(file_start_[d] + o, take, out);
      out += take;
      pos += take;
      continue;
    }
    *out++ = separators_.eos_id;  // o == body: the added EOS
    ++pos;
  }
}

}  // namespace hyper_parallel::train
