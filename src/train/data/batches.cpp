// Training data for hp-train: the synthetic Zipf-Markov corpus, the word-level
// text-file corpus and the (seed, step)-deterministic batch sampler (see batches.h).
#include "train/data/batches.h"

#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "train/data/token_id_file.h"
#include "train/data/word_tokenizer.h"

namespace hyper_parallel::train {
namespace {

// SplitMix64: tiny, fast, and its output is fixed by the algorithm (unlike
// std:: distributions), so streams are identical on every platform and build.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  // Uniform in [0, n): multiply-shift; its bias (n / 2^64) is negligible here.
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64); }

 private:
  uint64_t state_;
};

// Independent stream for a purpose: a seed and a salt hashed together, so
// nearby seeds / steps do not give correlated streams.
uint64_t derive_seed(uint64_t seed, uint64_t salt) {
  SplitMix64 a(seed);
  SplitMix64 b(a.next() ^ (salt * 0xD6E8FEB86659FD93ull));
  return b.next();
}

// Draws ranks 0..n-1 with p(r) ~ 1 / (r + q)^s (Zipf-Mandelbrot).
class ZipfSampler {
 public:
  ZipfSampler(int64_t n, double s, double q) : cdf_(static_cast<size_t>(n)) {
    double total = 0;
    for (int64_t r = 0; r < n; ++r) {
      total += std::pow(static_cast<double>(r) + q, -s);
      cdf_[static_cast<size_t>(r)] = total;
    }
    for (double& c : cdf_) c /= total;
  }
  int64_t sample(SplitMix64& rng) const {
    const double u = rng.uniform();
    auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
    return std::min<int64_t>(it - cdf_.begin(), static_cast<int64_t>(cdf_.size()) - 1);
  }

 private:
  std::vector<double> cdf_;
};

// Corpus parameters (documented in batches.h).
constexpr double kZipfExponent = 1.05;
constexpr double kZipfOffset = 2.7;
// Noise is drawn flatter than the base so the long tail of the vocabulary shows up
// (~92% of 32000 ids in 2M tokens), i.e. most embedding rows get some gradient.
constexpr double kNoiseZipfExponent = 0.7;
constexpr int kSuccessors = 4;
constexpr std::array<double, kSuccessors> kSuccessorCdf = {0.55, 0.80, 0.92, 1.0};
constexpr int64_t kNumPhrases = 2048;
constexpr int64_t kMinPhraseLen = 3;
constexpr int64_t kMaxPhraseLen = 8;
constexpr double kPhraseProb = 0.06;
constexpr double kNoiseProb = 0.10;

// A token stream with its 90/10 split: the parts are non-overlapping views of one
// buffer, so the split costs no copy.
class SplitCorpus : public TokenCorpus {
 public:
  SplitCorpus(at::Tensor all, int64_t vocab_size, std::string description)
      : vocab_size_(vocab_size), description_(std::move(description)) {
    const int64_t n = all.numel();
    const int64_t n_val = n / 10;
    train_ = all.narrow(0, 0, n - n_val);
    validation_ = all.narrow(0, n - n_val, n_val);
  }
  int64_t vocab_size() const override { return vocab_size_; }
  const at::Tensor& train_tokens() const override { return train_; }
  const at::Tensor& validation_tokens() const override { return validation_; }
  std::string describe() const override {
    std::ostringstream os;
    os << description_ << ": " << train_.numel() << " train + " << validation_.numel() << " validation tokens, vocab "
       << vocab_size_;
    return os.str();
  }

 private:
  int64_t vocab_size_;
  std::string description_;
  at::Tensor train_;
  at::Tensor validation_;
};

// The language: Zipf unigrams mapped to ids, successor table, phrases. Built from the
// seed alone; walks of any length are then drawn from it.
class ZipfMarkovLanguage {
 public:
  ZipfMarkovLanguage(int64_t vocab_size, uint64_t seed)
      : zipf_(vocab_size, kZipfExponent, kZipfOffset),
        noise_zipf_(vocab_size, kNoiseZipfExponent, kZipfOffset),
        phrase_zipf_(kNumPhrases, 1.0, kZipfOffset) {
    // Structure (tables) and the stream use separate streams, so changing the
    // generation loop never changes the language itself.
    SplitMix64 table_rng(derive_seed(seed, 1));
    rank_to_id_.resize(static_cast<size_t>(vocab_size));
    for (int64_t i = 0; i < vocab_size; ++i) rank_to_id_[static_cast<size_t>(i)] = i;
    for (int64_t i = vocab_size - 1; i > 0; --i) {
      std::swap(rank_to_id_[static_cast<size_t>(i)], rank_to_id_[table_rng.below(static_cast<uint64_t>(i + 1))]);
    }
    successors_.resize(static_cast<size_t>(vocab_size * kSuccessors));
    for (auto& s : successors_) s = zipf_id(table_rng);
    phrase_start_.assign(kNumPhrases + 1, 0);
    for (int64_t p = 0; p < kNumPhrases; ++p) {
      const int64_t len = kMinPhraseLen + static_cast<int64_t>(table_rng.below(kMaxPhraseLen - kMinPhraseLen + 1));
      for (int64_t k = 0; k < len; ++k) phrase_tokens_.push_back(zipf_id(table_rng));
      phrase_start_[static_cast<size_t>(p + 1)] = static_cast<int64_t>(phrase_tokens_.size());
    }
  }

  // Writes a walk of n tokens to o, drawn with rng.
  void walk(SplitMix64& rng, int64_t* o, int64_t n) const {
    if (n <= 0) return;
    int64_t cur = zipf_id(rng);
    o[0] = cur;
    int64_t i = 1;
    while (i < n) {
      const double u = rng.uniform();
      if (u < kPhraseProb) {
        const auto p = static_cast<size_t>(phrase_zipf_.sample(rng));
        for (int64_t k = phrase_start_[p]; k < phrase_start_[p + 1] && i < n; ++k) {
          cur = phrase_tokens_[static_cast<size_t>(k)];
          o[i++] = cur;
        }
        continue;
      }
      if (u < kPhraseProb + kNoiseProb) {
        cur = rank_to_id_[static_cast<size_t>(noise_zipf_.sample(rng))];
      } else {
        const double v = rng.uniform();
        int k = 0;
        while (k + 1 < kSuccessors && v >= kSuccessorCdf[static_cast<size_t>(k)]) ++k;
        cur = successors_[static_cast<size_t>(cur * kSuccessors + k)];
      }
      o[i++] = cur;
    }
  }

 private:
  int64_t zipf_id(SplitMix64& rng) const { return rank_to_id_[static_cast<size_t>(zipf_.sample(rng))]; }

  ZipfSampler zipf_, noise_zipf_, phrase_zipf_;
  std::vector<int64_t> rank_to_id_, successors_, phrase_start_, phrase_tokens_;
};

at::Tensor generate_synthetic(int64_t vocab_size, int64_t num_tokens, uint64_t seed) {
  const ZipfMarkovLanguage language(vocab_size, seed);
  at::Tensor out = at::empty({num_tokens}, at::kLong);
  SplitMix64 rng(derive_seed(seed, 2));
  language.walk(rng, out.data_ptr<int64_t>(), num_tokens);
  return out;
}

// Why `text` (the start of a corpus file) is not text, or "" when it is: a NUL byte,
// or a byte sequence that is not UTF-8. A truncated sequence at the very end is the
// cut of the sample, not an error.
std::string not_text_reason(std::string_view text) {
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == 0) return "a NUL byte at offset " + std::to_string(i);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0)
      return "not valid UTF-8: byte 0x" +
             [&] {
               char buf[3];
               std::snprintf(buf, sizeof buf, "%02x", c);
               return std::string(buf);
             }() +
             " at offset " + std::to_string(i);
    if (i + len > n) break;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) {
        return "not valid UTF-8: a broken multi-byte sequence at offset " + std::to_string(i);
      }
    }
    i += len;
  }
  return "";
}

}  // namespace

std::unique_ptr<TokenCorpus> make_synthetic_corpus(int64_t vocab_size, int64_t num_tokens, uint64_t seed) {
  TORCH_CHECK(vocab_size >= 64, "synthetic corpus: vocab_size must be >= 64, got ", vocab_size);
  TORCH_CHECK(num_tokens >= 100, "synthetic corpus: num_tokens must be >= 100, got ", num_tokens);
  std::ostringstream what;
  what << "synthetic corpus (Zipf-Markov with phrases, seed " << seed << ")";
  return std::make_unique<SplitCorpus>(generate_synthetic(vocab_size, num_tokens, seed), vocab_size, what.str());
}

std::unique_ptr<TokenCorpus> make_text_file_corpus(const std::string& path, int64_t vocab_size,
                                                   int64_t min_split_tokens) {
  TORCH_CHECK(vocab_size >= 3, "text corpus '", path, "': vocab_size must be >= 3 (<pad>, <unk> and one word), got ",
              vocab_size);
  const std::string what = "text corpus '" + path + "'";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "text corpus: cannot read '", path, "': ", std::strerror(errno));
  const std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* f) {
    ::close(*f);
    delete f;
  });

  // Streamed in 1 MiB chunks: words are interned as they come (ids in first-seen order)
  // and the ids go to a file, so memory is the word table, not the text or its tokens.
  std::unordered_map<std::string, int64_t> index;
  std::vector<std::string> words;
  TokenIdFile ids(what);
  WordTokenizer tokenizer([&](std::string_view w) {
    auto [it, inserted] = index.try_emplace(std::string(w), static_cast<int64_t>(words.size()));
    if (inserted) words.emplace_back(w);
    ids.append(it->second);
  });
  std::string chunk(size_t{1} << 20, '\0');
  for (bool first = true;; first = false) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n >= 0, "text corpus: cannot read '", path, "': ", std::strerror(errno));
    if (n == 0) break;
    const std::string_view bytes(chunk.data(), static_cast<size_t>(n));
    if (first) {
      // A binary file would tokenize into garbage words and train "fine"; say why it is refused.
      const std::string reason = not_text_reason(bytes);
      TORCH_CHECK(reason.empty(), what, " is not text (", reason,
                  "): training.data must be a UTF-8 or ASCII text file");
    }
    tokenizer.feed(bytes);
  }
  tokenizer.finish();

  const int64_t n = ids.size();
  const int64_t n_val = n / 10;
  const int64_t n_train = n - n_val;
  // One (input, target) pair needs two tokens; the validation part is the smaller one.
  const int64_t need = std::max<int64_t>(min_split_tokens, 2);
  TORCH_CHECK(n_val >= need, what, " is too short for one batch: its ", n, " tokens give ", n_train, " train + ", n_val,
              " validation tokens, but each part needs at least ", need, " (a file of at least ", 10 * need,
              " tokens)");

  // Vocabulary from the training part only, so validation measures unseen text.
  std::vector<int64_t> count(words.size(), 0);
  ids.for_each_block(n_train, /*rewrite=*/false, [&](int64_t* block, int64_t m) {
    for (int64_t i = 0; i < m; ++i) ++count[static_cast<size_t>(block[i])];
  });
  std::vector<int64_t> order;
  for (size_t w = 0; w < words.size(); ++w) {
    if (count[w] > 0) order.push_back(static_cast<int64_t>(w));
  }
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const auto ua = static_cast<size_t>(a), ub = static_cast<size_t>(b);
    return count[ua] != count[ub] ? count[ua] > count[ub] : words[ua] < words[ub];
  });
  const auto kept = std::min<size_t>(order.size(), static_cast<size_t>(vocab_size - 2));
  std::vector<int64_t> to_id(words.size(), 1);  // 1 = <unk>
  for (size_t r = 0; r < kept; ++r) to_id[static_cast<size_t>(order[r])] = static_cast<int64_t>(r) + 2;

  int64_t unk = 0;
  ids.for_each_block(n, /*rewrite=*/true, [&](int64_t* block, int64_t m) {
    for (int64_t i = 0; i < m; ++i) {
      block[i] = to_id[static_cast<size_t>(block[i])];
      unk += (block[i] == 1);
    }
  });

  std::ostringstream description;
  description.precision(3);
  description << what << " (" << words.size() << " distinct words, " << kept << " in vocabulary, "
              << 100.0 * static_cast<double>(unk) / static_cast<double>(n) << "% <unk>)";
  return std::make_unique<SplitCorpus>(ids.map(), vocab_size, description.str());
}

struct SyntheticBatchStream::Language {
  ZipfMarkovLanguage language;
};

SyntheticBatchStream::SyntheticBatchStream(int64_t vocab_size, int64_t batch_size, int64_t seq_len, uint64_t seed,
                                           uint64_t split, int64_t dp_rank, int64_t dp_size)
    : vocab_size_(vocab_size), seq_len_(seq_len), seed_(seed), split_(split) {
  TORCH_CHECK(vocab_size >= 64, "synthetic corpus: vocab_size must be >= 64, got ", vocab_size);
  TORCH_CHECK(batch_size > 0 && seq_len > 0, "synthetic corpus: batch_size and seq_len must be > 0, got ", batch_size,
              " and ", seq_len);
  TORCH_CHECK(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size,
              "synthetic corpus: expected 0 <= dp_rank < dp_size, got ", dp_rank, " and ", dp_size);
  TORCH_CHECK(batch_size % dp_size == 0, "synthetic corpus: batch_size ", batch_size,
              " must be divisible by the data-parallel size ", dp_size);
  rows_ = batch_size / dp_size;
  first_row_ = dp_rank * rows_;
  language_ = std::make_unique<Language>(Language{ZipfMarkovLanguage(vocab_size, seed)});
}

SyntheticBatchStream::~SyntheticBatchStream() = default;

Batch SyntheticBatchStream::batch_at(int64_t step) const {
  TORCH_CHECK(step >= 0, "SyntheticBatchStream: step must be >= 0, got ", step);
  at::Tensor input = at::empty({rows_, seq_len_}, at::kLong);
  at::Tensor target = at::empty({rows_, seq_len_}, at::kLong);
  std::vector<int64_t> walk(static_cast<size_t>(seq_len_ + 1));
  const uint64_t step_seed = derive_seed(derive_seed(seed_, 3 + split_), static_cast<uint64_t>(step));
  int64_t* in = input.data_ptr<int64_t>();
  int64_t* tg = target.data_ptr<int64_t>();
  const auto row_bytes = static_cast<size_t>(seq_len_) * sizeof(int64_t);
  for (int64_t r = 0; r < rows_; ++r) {
    SplitMix64 rng(derive_seed(step_seed, static_cast<uint64_t>(first_row_ + r)));
    language_->language.walk(rng, walk.data(), seq_len_ + 1);
    std::memcpy(in + r * seq_len_, walk.data(), row_bytes);
    std::memcpy(tg + r * seq_len_, walk.data() + 1, row_bytes);
  }
  return {input, target};
}

BatchSampler::BatchSampler(const at::Tensor& tokens, int64_t batch_size, int64_t seq_len, uint64_t seed)
    : batch_size_(batch_size), seq_len_(seq_len), seed_(seed) {
  TORCH_CHECK(tokens.defined() && tokens.dim() == 1 && tokens.scalar_type() == at::kLong,
              "BatchSampler: tokens must be a 1-D int64 tensor");
  TORCH_CHECK(batch_size > 0 && seq_len > 0, "BatchSampler: batch_size and seq_len must be > 0, got ", batch_size,
              " and ", seq_len);
  TORCH_CHECK(tokens.numel() >= seq_len + 1, "BatchSampler: ", tokens.numel(),
              " tokens are too few for one window of seq_len + 1 = ", seq_len + 1, " tokens");
  tokens_ = tokens.device().is_cpu() ? tokens.contiguous() : tokens.cpu().contiguous();
}

Batch BatchSampler::batch_at(int64_t step) const {
  TORCH_CHECK(step >= 0, "BatchSampler: step must be >= 0, got ", step);
  // A fresh stream per step: the batch depends on (seed, step) only.
  SplitMix64 rng(derive_seed(seed_, static_cast<uint64_t>(step)));
  const auto starts = static_cast<uint64_t>(tokens_.numel() - seq_len_);  // valid window starts
  at::Tensor input = at::empty({batch_size_, seq_len_}, at::kLong);
  at::Tensor target = at::empty({batch_size_, seq_len_}, at::kLong);
  const int64_t* src = tokens_.data_ptr<int64_t>();
  int64_t* in = input.data_ptr<int64_t>();
  int64_t* tg = target.data_ptr<int64_t>();
  const auto row_bytes = static_cast<size_t>(seq_len_) * sizeof(int64_t);
  for (int64_t b = 0; b < batch_size_; ++b) {
    const int64_t* w = src + rng.below(starts);
    std::memcpy(in + b * seq_len_, w, row_bytes);
    std::memcpy(tg + b * seq_len_, w + 1, row_bytes);
  }
  return {input, target};
}

ReplicaRows::ReplicaRows(std::shared_ptr<const BatchSource> global, int64_t dp_rank, int64_t dp_size)
    : global_(std::move(global)), dp_rank_(dp_rank), dp_size_(dp_size) {
  TORCH_CHECK(global_, "ReplicaRows: expected a batch source");
  TORCH_CHECK(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size, "ReplicaRows: expected 0 <= dp_rank < dp_size, got ",
              dp_rank, " and ", dp_size);
}

Batch ReplicaRows::batch_at(int64_t step) const { return micro_batch(global_->batch_at(step), dp_rank_, dp_size_); }

Batch micro_batch(const Batch& batch, int64_t index, int64_t count) {
  const int64_t rows = batch.input.size(0);
  TORCH_CHECK(count >= 1 && index >= 0 && index < count && rows % count == 0, "a batch of ", rows,
              " rows cannot be split into ", count, " equal parts (part ", index, " asked for)");
  const int64_t n = rows / count;
  return {batch.input.narrow(0, index * n, n), batch.target.narrow(0, index * n, n)};
}

}  // namespace hyper_parallel::train
