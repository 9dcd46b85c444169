// hp-train's training data: the synthetic corpus is deterministic, Zipf-like and
// learnable (next token predictable from the current one, also on held-out
// text); the batch sampler is a pure function of (seed, step); the text-file
// corpus tokenizes words and punctuation, maps rare words to <unk> and reports
// unreadable or too-short files by name.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <unordered_map>
#include <vector>

#include "compat/file_system.h"
#include "train/data/batches.h"
#include "train/data/corpus.h"
#include "train/data/token_id_file.h"

namespace data_test {

using namespace hyper_parallel::train;
namespace compat = hyper_parallel::compat;

namespace {

constexpr int64_t kVocab = 32000;
constexpr int64_t kTokens = 2'000'000;

// Generated once: several tests look at the same default-sized corpus.
const TokenCorpus& default_corpus() {
  static const std::unique_ptr<TokenCorpus> corpus = make_synthetic_corpus(kVocab, kTokens, 0);
  return *corpus;
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

std::vector<int64_t> unigram_counts(const std::vector<int64_t>& s, int64_t vocab) {
  std::vector<int64_t> count(static_cast<size_t>(vocab), 0);
  for (int64_t t : s) ++count[static_cast<size_t>(t)];
  return count;
}

double entropy_of_counts(const std::vector<int64_t>& counts) {
  double total = 0, h = 0;
  for (int64_t c : counts) total += static_cast<double>(c);
  for (int64_t c : counts) {
    if (c > 0) h -= static_cast<double>(c) / total * std::log(static_cast<double>(c) / total);
  }
  return h;
}

// Plug-in H(next | current) = H(current, next) - H(current), in nats.
double conditional_entropy(const std::vector<int64_t>& s, int64_t vocab) {
  std::vector<int64_t> keys;
  keys.reserve(s.size());
  for (size_t i = 0; i + 1 < s.size(); ++i) keys.push_back(s[i] * vocab + s[i + 1]);
  std::sort(keys.begin(), keys.end());
  std::vector<int64_t> joint;
  for (size_t i = 0; i < keys.size();) {
    size_t j = i;
    while (j < keys.size() && keys[j] == keys[i]) ++j;
    joint.push_back(static_cast<int64_t>(j - i));
    i = j;
  }
  std::vector<int64_t> current(s.begin(), s.end() - 1);
  return entropy_of_counts(joint) - entropy_of_counts(unigram_counts(current, vocab));
}

// Held-out cross-entropy (nats/token) of a bigram model fitted on train,
// Dirichlet-smoothed towards an add-one unigram; beta = 0 gives the unigram model.
double heldout_cross_entropy(const std::vector<int64_t>& train, const std::vector<int64_t>& val, int64_t vocab,
                             double beta_or_unigram) {
  const std::vector<int64_t> uni = unigram_counts(train, vocab);
  const double uni_total = static_cast<double>(train.size() + static_cast<size_t>(vocab));
  auto p_uni = [&](int64_t t) { return (static_cast<double>(uni[static_cast<size_t>(t)]) + 1) / uni_total; };
  std::unordered_map<int64_t, int64_t> bigram;
  std::vector<int64_t> context(static_cast<size_t>(vocab), 0);
  for (size_t i = 0; i + 1 < train.size(); ++i) {
    ++bigram[train[i] * vocab + train[i + 1]];
    ++context[static_cast<size_t>(train[i])];
  }
  double nll = 0;
  for (size_t i = 0; i + 1 < val.size(); ++i) {
    const int64_t c = val[i], n = val[i + 1];
    double p = p_uni(n);
    if (beta_or_unigram > 0) {
      auto it = bigram.find(c * vocab + n);
      const double pair = it == bigram.end() ? 0.0 : static_cast<double>(it->second);
      p = (pair + beta_or_unigram * p) / (static_cast<double>(context[static_cast<size_t>(c)]) + beta_or_unigram);
    }
    nll -= std::log(p);
  }
  return nll / static_cast<double>(val.size() - 1);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

// A file under the temp dir, removed when the test ends.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& content)
      : path_(compat::join_path(compat::temp_directory(), "hp_data_test_" + std::to_string(::getpid()) + "_" + name)) {
    std::ofstream(path_, std::ios::binary) << content;
  }
  ~TempFile() { compat::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

// --- synthetic corpus ----------------------------------------------------------

TEST(SyntheticCorpus, DeterministicForASeedAndDifferentAcrossSeeds) {
  auto a = make_synthetic_corpus(kVocab, 300'000, 7);
  auto b = make_synthetic_corpus(kVocab, 300'000, 7);
  auto c = make_synthetic_corpus(kVocab, 300'000, 8);
  EXPECT_TRUE(at::equal(a->train_tokens(), b->train_tokens()));
  EXPECT_TRUE(at::equal(a->validation_tokens(), b->validation_tokens()));
  const double same = a->train_tokens().eq(c->train_tokens()).to(at::kDouble).mean().item<double>();
  EXPECT_LT(same, 0.05) << "seeds 7 and 8 give nearly the same stream";
}

TEST(SyntheticCorpus, VocabularyOfAtLeast32000WithAllIdsInRange) {
  const TokenCorpus& corpus = default_corpus();
  EXPECT_GE(corpus.vocab_size(), 32000);
  for (const at::Tensor& t : {corpus.train_tokens(), corpus.validation_tokens()}) {
    EXPECT_EQ(t.scalar_type(), at::kLong);
    EXPECT_EQ(t.dim(), 1);
    EXPECT_GE(t.min().item<int64_t>(), 0);
    EXPECT_LT(t.max().item<int64_t>(), corpus.vocab_size());
  }
  // The vocabulary is really in use, not just declared.
  const auto counts = unigram_counts(to_vector(corpus.train_tokens()), kVocab);
  const auto used = std::count_if(counts.begin(), counts.end(), [](int64_t c) { return c > 0; });
  EXPECT_GT(used, kVocab * 8 / 10);
}

TEST(SyntheticCorpus, UnigramFrequencyIsZipfLike) {
  auto counts = unigram_counts(to_vector(default_corpus().train_tokens()), kVocab);
  std::sort(counts.begin(), counts.end(), std::greater<>());
  const int64_t median = counts[counts.size() / 2];
  ASSERT_GT(median, 0);
  EXPECT_GT(counts[0], 100 * median);
  // Least-squares slope of log(frequency) over log(rank), ranks 1..2000.
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const int n = 2000;
  for (int r = 1; r <= n; ++r) {
    const double x = std::log(r), y = std::log(static_cast<double>(counts[static_cast<size_t>(r - 1)]));
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  std::printf("[ stats    ] top/median frequency %.0f, rank-frequency slope %.2f\n",
              static_cast<double>(counts[0]) / static_cast<double>(median), slope);
  EXPECT_LT(slope, -0.6);
  EXPECT_GT(slope, -1.6);
}

TEST(SyntheticCorpus, NextTokenIsPredictableFromTheCurrentOne) {
  const auto stream = to_vector(default_corpus().train_tokens());
  const double h_unigram = entropy_of_counts(unigram_counts(stream, kVocab));
  const double h_cond = conditional_entropy(stream, kVocab);
  // Control: the same tokens in random order, measured the same way (the plug-in
  // estimate is biased low on sparse pairs; the shuffle shows how much).
  auto shuffled = stream;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(1));
  const double h_cond_shuffled = conditional_entropy(shuffled, kVocab);
  std::printf("[ stats    ] ln(V) %.2f, H(unigram) %.2f, H(next|cur) %.2f, shuffled %.2f nats\n",
              std::log(static_cast<double>(kVocab)), h_unigram, h_cond, h_cond_shuffled);
  EXPECT_LT(h_unigram, std::log(static_cast<double>(kVocab)) - 1.0);
  EXPECT_LT(h_cond, h_unigram - 3.0);
  EXPECT_LT(h_cond, h_cond_shuffled - 2.0);
}

TEST(SyntheticCorpus, BigramStructureCarriesOverToValidation) {
  const TokenCorpus& corpus = default_corpus();
  const auto train = to_vector(corpus.train_tokens());
  const auto val = to_vector(corpus.validation_tokens());
  const double ce_unigram = heldout_cross_entropy(train, val, kVocab, 0.0);
  const double ce_bigram = heldout_cross_entropy(train, val, kVocab, 5.0);
  std::printf("[ stats    ] validation cross-entropy: unigram %.2f, bigram %.2f nats\n", ce_unigram, ce_bigram);
  // What a model learns on train lowers the loss on validation well below ln(V).
  EXPECT_LT(ce_unigram, std::log(static_cast<double>(kVocab)) - 1.0);
  EXPECT_LT(ce_bigram, ce_unigram - 2.0);
}

TEST(SyntheticCorpus, TrainAndValidationAreDisjointNinetyTenParts) {
  auto corpus = make_synthetic_corpus(kVocab, 100'000, 3);
  const at::Tensor& train = corpus->train_tokens();
  const at::Tensor& val = corpus->validation_tokens();
  EXPECT_EQ(train.numel(), 90'000);
  EXPECT_EQ(val.numel(), 10'000);
  // No shared elements in memory: validation starts where train ends.
  const int64_t* train_end = train.data_ptr<int64_t>() + train.numel();
  const int64_t* val_begin = val.data_ptr<int64_t>();
  EXPECT_TRUE(val_begin >= train_end || val_begin + val.numel() <= train.data_ptr<int64_t>());
  // And not a copy of a piece of train.
  EXPECT_FALSE(at::equal(val, train.narrow(0, 0, val.numel())));
}

TEST(SyntheticCorpus, GeneratesTwoMillionTokensQuickly) {
  const auto t0 = std::chrono::steady_clock::now();
  auto corpus = make_synthetic_corpus(kVocab, kTokens, 11);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ stats    ] 2M tokens generated in %.3f s\n", seconds);
  EXPECT_EQ(corpus->train_tokens().numel() + corpus->validation_tokens().numel(), kTokens);
  EXPECT_LT(seconds, 5.0);  // ~0.1 s optimized; only catches gross regressions
}

TEST(SyntheticCorpus, DescribesItselfAndRejectsBadSizes) {
  auto corpus = make_synthetic_corpus(kVocab, 1000, 5);
  const std::string d = corpus->describe();
  EXPECT_NE(d.find("synthetic"), std::string::npos) << d;
  EXPECT_NE(d.find("900 train"), std::string::npos) << d;
  EXPECT_NE(d.find("100 validation"), std::string::npos) << d;
  EXPECT_NE(d.find("vocab 32000"), std::string::npos) << d;
  EXPECT_NE(error_of([] { make_synthetic_corpus(10, 1000, 0); }).find("vocab_size"), std::string::npos);
  EXPECT_NE(error_of([] { make_synthetic_corpus(kVocab, 5, 0); }).find("num_tokens"), std::string::npos);
}

// --- batch sampler -------------------------------------------------------------

TEST(BatchSampler, BatchDependsOnlyOnSeedAndStep) {
  const at::Tensor& tokens = default_corpus().train_tokens();
  BatchSampler a(tokens, 8, 128, 42);
  BatchSampler b(tokens, 8, 128, 42);
  // b visits steps in another order, as a resumed run would.
  const Batch b9 = b.batch_at(9);
  const Batch b3 = b.batch_at(3);
  const Batch a3 = a.batch_at(3);
  const Batch a9 = a.batch_at(9);
  EXPECT_TRUE(at::equal(a3.input, b3.input));
  EXPECT_TRUE(at::equal(a3.target, b3.target));
  EXPECT_TRUE(at::equal(a9.input, b9.input));
  EXPECT_TRUE(at::equal(a.batch_at(3).input, a3.input));
  EXPECT_FALSE(at::equal(a3.input, a9.input));
  EXPECT_FALSE(at::equal(BatchSampler(tokens, 8, 128, 43).batch_at(3).input, a3.input));
}

TEST(BatchSampler, TargetIsInputShiftedByOneToken) {
  // On the stream 0, 1, 2, ... each row must read start, start+1, ... and the
  // target the same window one token later.
  const int64_t n = 1000, seq = 16;
  BatchSampler sampler(at::arange(n, at::kLong), 32, seq, 1);
  for (int64_t step = 0; step < 20; ++step) {
    const Batch batch = sampler.batch_at(step);
    ASSERT_EQ(batch.input.sizes(), c10::IntArrayRef({32, seq}));
    ASSERT_EQ(batch.target.sizes(), c10::IntArrayRef({32, seq}));
    EXPECT_EQ(batch.input.scalar_type(), at::kLong);
    EXPECT_TRUE(at::equal(batch.target, batch.input + 1));
    const at::Tensor start = batch.input.select(1, 0).unsqueeze(1);
    EXPECT_TRUE(at::equal(batch.input, start + at::arange(seq, at::kLong)));
    EXPECT_GE(start.min().item<int64_t>(), 0);
    EXPECT_LE(batch.target.max().item<int64_t>(), n - 1);
  }
  // On real tokens: target[:, t] == input[:, t + 1].
  const Batch real = BatchSampler(default_corpus().train_tokens(), 4, 64, 2).batch_at(0);
  EXPECT_TRUE(at::equal(real.target.narrow(1, 0, 63), real.input.narrow(1, 1, 63)));
}

TEST(BatchSampler, WindowsReachBothEndsOfTheStream) {
  // Exactly seq_len + 1 tokens: the only window is the whole stream.
  const Batch only = BatchSampler(at::arange(9, at::kLong), 3, 8, 0).batch_at(5);
  EXPECT_TRUE(at::equal(only.input, at::arange(8, at::kLong).expand({3, 8})));
  EXPECT_TRUE(at::equal(only.target, at::arange(1, 9, at::kLong).expand({3, 8})));
  // Eleven tokens: starts 0..2, all of them drawn over a few steps.
  BatchSampler sampler(at::arange(11, at::kLong), 16, 8, 0);
  std::vector<bool> seen(3, false);
  for (int64_t step = 0; step < 4; ++step) {
    for (int64_t s : to_vector(sampler.batch_at(step).input.select(1, 0))) seen[static_cast<size_t>(s)] = true;
  }
  EXPECT_TRUE(seen[0] && seen[1] && seen[2]);
}

TEST(BatchSampler, EveryRankThreadBuildsTheSameBatch) {
  const at::Tensor& tokens = default_corpus().train_tokens();
  const Batch expected = BatchSampler(tokens, 4, 256, 5).batch_at(17);
  std::vector<Batch> got(4);
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < got.size(); ++r) {
    ranks.emplace_back([&, r] { got[r] = BatchSampler(tokens, 4, 256, 5).batch_at(17); });
  }
  for (auto& t : ranks) t.join();
  for (const Batch& b : got) {
    EXPECT_TRUE(at::equal(b.input, expected.input));
    EXPECT_TRUE(at::equal(b.target, expected.target));
  }
}

TEST(BatchSampler, RejectsBadArguments) {
  const at::Tensor tokens = at::arange(100, at::kLong);
  EXPECT_NE(error_of([&] { BatchSampler(tokens, 2, 100, 0); }).find("too few"), std::string::npos);
  EXPECT_NE(error_of([&] { BatchSampler(tokens.to(at::kInt), 2, 8, 0); }).find("int64"), std::string::npos);
  EXPECT_NE(error_of([&] { BatchSampler(tokens.view({10, 10}), 2, 4, 0); }).find("1-D"), std::string::npos);
  EXPECT_NE(error_of([&] { BatchSampler(tokens, 0, 8, 0); }).find("batch_size"), std::string::npos);
  EXPECT_NE(error_of([&] { BatchSampler(tokens, 2, 8, 0).batch_at(-1); }).find("step"), std::string::npos);
}

// --- text-file corpus ----------------------------------------------------------

// 18 training tokens (the x5, "," x4, cat x3, don't x2, then "!", hello, world,
// zebra once each) and 2 validation tokens ("cat", "unseen").
const char* const kSmallText = "The the, THE cat!\nthe, the Cat, cat,\tdon't hello don't world zebra cat unseen\n";

TEST(TextFileCorpus, TokenizesWordsAndPunctuationInFrequencyOrder) {
  TempFile file("words.txt", kSmallText);
  auto corpus = make_text_file_corpus(file.path(), 100);
  EXPECT_EQ(corpus->vocab_size(), 100);
  // Ids: <pad> 0, <unk> 1, the 2, "," 3, cat 4, don't 5, "!" 6, hello 7, world 8, zebra 9.
  EXPECT_EQ(to_vector(corpus->train_tokens()),
            (std::vector<int64_t>{2, 2, 3, 2, 4, 6, 2, 3, 2, 4, 3, 4, 3, 5, 7, 5, 8, 9}));
  // "unseen" appears only in validation, so it is not in the vocabulary.
  EXPECT_EQ(to_vector(corpus->validation_tokens()), (std::vector<int64_t>{4, 1}));
  const std::string d = corpus->describe();
  EXPECT_NE(d.find(file.path()), std::string::npos) << d;
  EXPECT_NE(d.find("18 train + 2 validation"), std::string::npos) << d;
}

TEST(TextFileCorpus, RareWordsBecomeUnkWhenTheVocabularyIsSmall) {
  TempFile file("small_vocab.txt", kSmallText);
  auto corpus = make_text_file_corpus(file.path(), 5);  // <pad>, <unk>, the, ",", cat
  EXPECT_EQ(corpus->vocab_size(), 5);
  EXPECT_EQ(to_vector(corpus->train_tokens()),
            (std::vector<int64_t>{2, 2, 3, 2, 4, 1, 2, 3, 2, 4, 3, 4, 3, 1, 1, 1, 1, 1}));
  EXPECT_EQ(to_vector(corpus->validation_tokens()), (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(corpus->train_tokens().min().item<int64_t>(), 1);  // <pad> is never produced
}

TEST(TextFileCorpus, KeepsApostrophesInsideWordsAndUtf8WordsWhole) {
  // Per line: café's | naïve | dogs | ' | end | . | . | .  (8 tokens, 6 distinct).
  std::string text;
  for (int i = 0; i < 5; ++i) text += "Café's NAÏVE dogs' end...\n";
  TempFile file("utf8.txt", text);
  auto corpus = make_text_file_corpus(file.path(), 1000);
  const auto train = to_vector(corpus->train_tokens());
  ASSERT_EQ(train.size() + static_cast<size_t>(corpus->validation_tokens().numel()), 40u);
  for (size_t i = 8; i < train.size(); ++i) EXPECT_EQ(train[i], train[i - 8]);
  std::vector<int64_t> line(train.begin(), train.begin() + 8);
  EXPECT_EQ(line[5], line[6]);
  EXPECT_EQ(line[6], line[7]);
  std::sort(line.begin(), line.end());
  EXPECT_EQ(std::unique(line.begin(), line.end()) - line.begin(), 6);
  EXPECT_EQ(std::count(train.begin(), train.end(), 1), 0);  // no <unk>: all fit
}

TEST(TextFileCorpus, MissingFileIsAnErrorNamingTheFile) {
  const std::string path = "/nonexistent/hp_data_test/corpus.txt";
  const std::string err = error_of([&] { make_text_file_corpus(path, 100); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("cannot read"), std::string::npos) << err;
  const std::string dir = compat::temp_directory();
  const std::string dir_err = error_of([&] { make_text_file_corpus(dir, 100); });
  EXPECT_NE(dir_err.find(dir), std::string::npos) << dir_err;
}

TEST(TextFileCorpus, TooShortFileIsAnErrorNamingTheFile) {
  TempFile tiny("tiny.txt", "just a few words .\n");
  const std::string err = error_of([&] { make_text_file_corpus(tiny.path(), 100); });
  EXPECT_NE(err.find(tiny.path()), std::string::npos) << err;
  EXPECT_NE(err.find("too short"), std::string::npos) << err;
  TempFile empty("empty.txt", "");
  EXPECT_NE(error_of([&] { make_text_file_corpus(empty.path(), 100); }).find("too short"), std::string::npos);
  // Long enough for a pair of tokens, not for a window of seq_len + 1 = 65.
  TempFile small("short_for_window.txt", kSmallText);
  EXPECT_NO_THROW(make_text_file_corpus(small.path(), 100));
  const std::string window_err = error_of([&] { make_text_file_corpus(small.path(), 100, 65); });
  EXPECT_NE(window_err.find("too short"), std::string::npos) << window_err;
  EXPECT_NE(window_err.find("65"), std::string::npos) << window_err;
}

TEST(TextFileCorpus, ABinaryFileIsRejectedWithTheReason) {
  std::string bytes(kSmallText);
  bytes += std::string(
      "\x7f"
      "ELF\x02\x01\x01\x00\x00\x00\x00",
      11);
  for (int i = 0; i < 200; ++i) bytes += static_cast<char>(i % 7);
  TempFile binary("binary.bin", bytes);
  const std::string err = error_of([&] { make_text_file_corpus(binary.path(), 100); });
  EXPECT_NE(err.find(binary.path()), std::string::npos) << err;
  EXPECT_NE(err.find("is not text"), std::string::npos) << err;
  EXPECT_NE(err.find("NUL byte at offset " + std::to_string(std::string(kSmallText).size() + 7)), std::string::npos)
      << err;
}

// The process's peak resident memory (kB) since the last reset_peak_memory().
int64_t peak_memory_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}
bool reset_peak_memory() { return static_cast<bool>(std::ofstream("/proc/self/clear_refs") << "5"); }

TEST(TextFileCorpus, MemoryDoesNotGrowWithTheFile) {
  // A 24 MB file of 4.4 M words: the corpus used to hold the text, every token's first-seen
  // id and the final ids in memory (> 60 MB); streamed, its peak is the word table and
  // buffers, and the token ids live in a file mapping that sampling pages in.
  std::string text;
  text.reserve(25u << 20);
  std::mt19937 rng(7);
  while (text.size() < (24u << 20)) text += "w" + std::to_string(rng() % 5000) + (rng() % 8 ? " " : ".\n");
  TempFile file("big.txt", text);
  text.clear();
  text.shrink_to_fit();
  if (peak_memory_kb() < 0 || !reset_peak_memory()) GTEST_SKIP() << "no /proc/self/status or clear_refs here";
  const int64_t before = peak_memory_kb();
  auto corpus = make_text_file_corpus(file.path(), 1000);
  const int64_t grown_mb = (peak_memory_kb() - before) / 1024;
  EXPECT_GT(corpus->train_tokens().numel(), 4'000'000);
  std::cout << "peak memory grew by " << grown_mb << " MB reading a 24 MB corpus\n";
  EXPECT_LT(grown_mb, 16) << "peak memory grew by " << grown_mb << " MB reading a 24 MB corpus";
  // Sampling reads the ids where they live.
  const Batch b = BatchSampler(corpus->train_tokens(), 4, 64, 1).batch_at(3);
  EXPECT_TRUE(at::equal(b.input.narrow(1, 1, 63), b.target.narrow(1, 0, 63)));
  EXPECT_GE(b.input.min().item<int64_t>(), 1);
}

TEST(TextFileCorpus, WordsAcrossReadChunksStayWhole) {
  // The file is read in 1 MiB chunks: a word (with its apostrophe, or a UTF-8 letter) that
  // straddles a chunk's end must still be one token.
  // At byte 2^20 - 2: "don't"; at 2^21 - 2: "café"; at 3 * 2^20 - 2: "x'" then " x" (a
  // trailing apostrophe is a token of its own).
  std::string t;
  for (size_t boundary : {size_t{1} << 20, size_t{2} << 20, size_t{3} << 20}) {
    while (t.size() < boundary - 3) t += "x ";
    t.resize(boundary - 2, ' ');
    t += boundary == (size_t{1} << 20) ? "don't " : boundary == (size_t{2} << 20) ? "caf\xc3\xa9 " : "x' x ";
  }
  while (t.size() < (size_t{4} << 20)) t += "x ";  // all of the above in the training part
  TempFile file("chunks.txt", t);
  auto corpus = make_text_file_corpus(file.path(), 100);
  const int64_t n = corpus->train_tokens().numel() + corpus->validation_tokens().numel();
  int64_t expect = 0;
  {  // count the tokens by the rules, on the whole text
    bool in_word = false;
    for (size_t i = 0; i < t.size(); ++i) {
      const auto c = static_cast<unsigned char>(t[i]);
      const bool word =
          std::isalnum(c) || c >= 0x80 ||
          (c == '\'' && in_word && i + 1 < t.size() && std::isalnum(static_cast<unsigned char>(t[i + 1])));
      if (word && !in_word) ++expect;
      if (!word && std::isgraph(c)) ++expect;
      in_word = word;
    }
  }
  EXPECT_EQ(n, expect);
  // x, don't, café and ' only: a split word would add pieces ("don", "t", "caf", ...).
  EXPECT_EQ(std::get<0>(at::_unique(corpus->train_tokens())).numel(), 4);
}

TEST(TextFileCorpus, NoRoomForTheTokenIdsIsAnErrorNamingTheFolder) {
  TempFile file("words_tmpdir.txt", kSmallText);
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  ::setenv("TMPDIR", "/nonexistent/hp_data_test_tmp", 1);
  const std::string err = error_of([&] { make_text_file_corpus(file.path(), 100); });
  if (old)
    ::setenv("TMPDIR", saved.c_str(), 1);
  else
    ::unsetenv("TMPDIR");
  EXPECT_NE(err.find(file.path()), std::string::npos) << err;
  EXPECT_NE(err.find("/nonexistent/hp_data_test_tmp"), std::string::npos) << err;
  EXPECT_NE(err.find("No such file or directory"), std::string::npos) << err;
  EXPECT_NE(err.find("set TMPDIR"), std::string::npos) << err;
}

// The ids come back through the mapping; a range past the file and a second mapping
// are errors naming the corpus.
TEST(TokenIdFile, IdsComeBackAndMisuseIsNamed) {
  TokenIdFile ids("corpus 'x'");
  const int64_t n = (int64_t{1} << 16) + 5;  // a whole block and a few in the buffer
  for (int64_t i = 0; i < n; ++i) ids.append(i * 3);
  EXPECT_EQ(ids.size(), n);
  EXPECT_NE(error_of([&] {
              ids.for_each_block(n + 1, false, [](int64_t*, int64_t) {});
            }).find("corpus 'x': token id range [0, " + std::to_string(n + 1) + ") is not in the file"),
            std::string::npos);
  const at::Tensor mapped = ids.map();
  ASSERT_EQ(mapped.numel(), n);
  EXPECT_TRUE(mapped.equal(at::arange(n, at::kLong) * 3));
  EXPECT_NE(error_of([&] { ids.map(); }).find("corpus 'x': its token ids were already mapped"), std::string::npos);
}

TEST(TextFileCorpus, InvalidUtf8IsRejectedButValidUtf8IsText) {
  std::string latin1(kSmallText);
  for (int i = 0; i < 50; ++i) latin1 += "caf\xe9 ";  // Latin-1, not UTF-8
  TempFile bad("latin1.txt", latin1);
  const std::string err = error_of([&] { make_text_file_corpus(bad.path(), 100); });
  EXPECT_NE(err.find("not valid UTF-8"), std::string::npos) << err;
  std::string utf8(kSmallText);
  for (int i = 0; i < 50; ++i) utf8 += "caf\xc3\xa9 ";
  TempFile good("utf8.txt", utf8);
  EXPECT_NO_THROW(make_text_file_corpus(good.path(), 100));
}

// --- the streamed synthetic corpus ----------------------------------------------------

TEST(SyntheticStream, BatchesDependOnlyOnSeedAndStepAndStayInTheVocabulary) {
  SyntheticBatchStream a(kVocab, 4, 32, /*seed=*/7, /*split=*/0);
  SyntheticBatchStream b(kVocab, 4, 32, /*seed=*/7, /*split=*/0);
  const Batch late = a.batch_at(1'000'000'000);  // any step, without generating the ones before
  EXPECT_TRUE(at::equal(late.input, b.batch_at(1'000'000'000).input));
  EXPECT_TRUE(at::equal(a.batch_at(3).input, b.batch_at(3).input));
  EXPECT_FALSE(at::equal(a.batch_at(3).input, a.batch_at(4).input));
  SyntheticBatchStream validation(kVocab, 4, 32, 7, /*split=*/1);
  EXPECT_FALSE(at::equal(a.batch_at(3).input, validation.batch_at(3).input)) << "train and validation differ";
  EXPECT_EQ(late.input.sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_GE(late.input.min().item<int64_t>(), 0);
  EXPECT_LT(late.input.max().item<int64_t>(), kVocab);
  // Target is input shifted by one token.
  EXPECT_TRUE(at::equal(late.input.narrow(1, 1, 31), late.target.narrow(1, 0, 31)));
}

TEST(SyntheticStream, DataParallelShardsAreTheRowsOfTheGlobalBatch) {
  SyntheticBatchStream whole(kVocab, 8, 16, 3, 0);
  SyntheticBatchStream first(kVocab, 8, 16, 3, 0, /*dp_rank=*/0, /*dp_size=*/2);
  SyntheticBatchStream second(kVocab, 8, 16, 3, 0, /*dp_rank=*/1, /*dp_size=*/2);
  const Batch all = whole.batch_at(5);
  EXPECT_TRUE(at::equal(first.batch_at(5).input, all.input.narrow(0, 0, 4)));
  EXPECT_TRUE(at::equal(second.batch_at(5).input, all.input.narrow(0, 4, 4)));
  EXPECT_NE(error_of([] { SyntheticBatchStream(kVocab, 8, 16, 3, 0, 0, 3); }).find("divisible"), std::string::npos);
}

TEST(SyntheticStream, IsAsLearnableAsTheCorpus) {
  // The next token is predictable from the current one, as in the materialized corpus.
  SyntheticBatchStream s(kVocab, 64, 128, 0, 0);
  std::unordered_map<int64_t, std::unordered_map<int64_t, int64_t>> next;
  int64_t pairs = 0;
  for (int64_t step = 0; step < 40; ++step) {
    const Batch batch = s.batch_at(step);
    const auto in = to_vector(batch.input.flatten()), tg = to_vector(batch.target.flatten());
    for (size_t i = 0; i < in.size(); ++i) ++next[in[i]][tg[i]], ++pairs;
  }
  double top = 0;  // share of pairs whose target is the current token's most frequent successor
  for (const auto& [cur, successors] : next) {
    int64_t best = 0;
    for (const auto& [t, n] : successors) best = std::max(best, n);
    top += static_cast<double>(best);
  }
  EXPECT_GT(top / static_cast<double>(pairs), 0.4);
}

// --- one corpus interface ---------------------------------------------------------

// open_training_corpus gives each kind of training.data its batches: each replica's rows
// are its share of the global batch, validation batches are not the training ones, and
// only a pre-tokenized corpus has a file identity to record (the others are identified by
// training.data and the seed).
TEST(TrainingCorpus, EveryKindSplitsTheGlobalBatchByReplicaAndKeepsValidationApart) {
  TempFile text("corpus_words.txt", std::string(kSmallText) + kSmallText + kSmallText);
  TrainingConfig t;
  t.batch_size = 4;
  t.seq_len = 3;
  t.seed = 5;
  for (const std::string& data : {std::string(), text.path()}) {
    SCOPED_TRACE(data.empty() ? "synthetic" : "text");
    t.data = data;
    const auto corpus = open_training_corpus(t, 100);
    EXPECT_FALSE(corpus->identity().has_value());
    EXPECT_NE(corpus->describe().find(data.empty() ? "synthetic" : text.path()), std::string::npos);
    const Batch whole = corpus->train_batches(0, 1)->batch_at(2);
    ASSERT_EQ(whole.input.sizes(), (std::vector<int64_t>{4, 3}));
    for (int64_t r = 0; r < 2; ++r) {
      const Batch part = corpus->train_batches(r, 2)->batch_at(2);
      EXPECT_TRUE(at::equal(part.input, whole.input.narrow(0, 2 * r, 2)));
      EXPECT_TRUE(at::equal(part.target, whole.target.narrow(0, 2 * r, 2)));
    }
    bool differs = false;
    for (int64_t step = 0; step < 4; ++step) {
      differs |= !at::equal(corpus->validation_batches(0, 1)->batch_at(step).input,
                            corpus->train_batches(0, 1)->batch_at(step).input);
    }
    EXPECT_TRUE(differs);
  }
  // The text corpus samples its training windows with training.seed and its validation
  // windows with training.seed + 1, as BatchSampler over each part.
  const auto tokens = make_text_file_corpus(text.path(), 100, t.seq_len + 1);
  const auto corpus = open_training_corpus(t, 100);
  EXPECT_TRUE(at::equal(corpus->train_batches(0, 1)->batch_at(1).input,
                        BatchSampler(tokens->train_tokens(), 4, 3, 5).batch_at(1).input));
  EXPECT_TRUE(at::equal(corpus->validation_batches(0, 1)->batch_at(1).input,
                        BatchSampler(tokens->validation_tokens(), 4, 3, 6).batch_at(1).input));
  t.eos_id = 0;
  EXPECT_NE(error_of([&] { open_training_corpus(t, 100); }).find("apply to pre-tokenized corpora only"),
            std::string::npos);
}

}  // namespace data_test
