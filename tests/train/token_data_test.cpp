// Pre-tokenized corpora: Megatron indexed datasets and flat nanoGPT files written by the
// Python writers of scripts/tokenize_corpus.py (which follow Megatron's layout) read back
// exactly; every malformed field is an error naming the file and the field; documents are
// separated by EOS / BOS so a window that crosses documents sees a separator; windows are
// split per data-parallel rank, shuffled per epoch, each visited once, and a pure function
// of (seed, step); hp-train trains on such a corpus, identically at DP 1 and DP 2 and
// across a resume.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "compat/file_system.h"
#include "harness/build_paths.h"
#include "harness/train_steps.h"
#include "train/data/corpus_identity.h"
#include "train/data/flat_token_file.h"
#include "io/mapped_file.h"
#include "train/data/megatron_indexed_dataset.h"
#include "train/data/pretokenized_corpus.h"
#include "train/data/token_documents.h"
#include "train/data/token_windows.h"
#include "train/data/window_permutation.h"

namespace token_data_test {

using namespace hyper_parallel::train;
namespace compat = hyper_parallel::compat;
using hyper_parallel::testing::train_steps;

namespace {

using Docs = std::vector<std::vector<int64_t>>;

std::string temp_dir(const std::string& name) {
  const std::string dir =
      compat::join_path(compat::temp_directory(), "hp_token_data_" + std::to_string(::getpid()) + "_" + name);
  compat::remove_all(dir);
  compat::create_directories(dir);
  return dir;
}

std::string python() {
  const std::string configured = hyper_parallel::testing::python_path();
  return configured.empty() ? "python3" : configured;
}

// Writes `docs` with scripts/tokenize_corpus.py's writers (format "bin" or "megatron").
// Megatron documents are split into sequences of at most `max_sequence` tokens (as
// Megatron's --split-sentences does) to exercise multi-sequence documents.
void python_write(const std::string& prefix, const Docs& docs, const std::string& format, const std::string& dtype,
                  const nlohmann::json& sidecar = nullptr, int max_sequence = 1 << 30) {
  const std::string docs_path = prefix + ".docs.json";
  std::ofstream(docs_path) << nlohmann::json(docs).dump();
  const std::string script = prefix + ".write.py";
  std::ofstream(script) << "import json, sys\n"
                        << "sys.path.insert(0, "
                        << nlohmann::json(hyper_parallel::testing::source_dir() + "/scripts").dump()
                        << ")\nimport tokenize_corpus as tc\n"
                        << "docs = json.load(open(" << nlohmann::json(docs_path).dump() << "))\n"
                        << "prefix, fmt, dtype, cut = " << nlohmann::json(prefix).dump() << ", \"" << format << "\", \""
                        << dtype << "\", " << max_sequence << "\n"
                        << "w = tc.FlatWriter(prefix, dtype) if fmt == 'bin' else tc.MegatronWriter(prefix, dtype)\n"
                        << "for d in docs:\n"
                        << "    if fmt == 'bin':\n        w.add_document(d)\n        continue\n"
                        << "    for i in range(0, max(len(d), 1), cut):\n        w.add_sequence(d[i:i + cut])\n"
                        << "    w.end_document()\n"
                        << "w.finish()\n"
                        << "side = json.loads(" << nlohmann::json(sidecar.dump()).dump() << ")\n"
                        << "if side is not None:\n"
                        << "    tc.write_sidecar(prefix, fmt, w, side['vocab_size'], side.get('eos_id'), "
                           "side.get('bos_id'), 'test-tokenizer', 'abc')\n";
  const std::string cmd = python() + " " + script + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// Documents of random lengths (some empty) over ids [2, vocab): 0 and 1 are kept free
// for EOS / BOS.
Docs random_docs(int n, int64_t vocab, uint32_t seed, int max_len = 40) {
  std::mt19937 rng(seed);
  Docs docs(static_cast<size_t>(n));
  for (auto& d : docs) {
    const int len = static_cast<int>(rng() % static_cast<uint32_t>(max_len + 1));
    for (int i = 0; i < len; ++i) d.push_back(2 + static_cast<int64_t>(rng() % static_cast<uint32_t>(vocab - 2)));
  }
  return docs;
}

// The stream TokenDocuments must give: each non-empty document with BOS / EOS added
// where configured and not already there.
std::vector<int64_t> reference_stream(const Docs& docs, DocumentSeparators sep) {
  std::vector<int64_t> out;
  for (const auto& d : docs) {
    if (d.empty()) continue;
    if (sep.bos_id >= 0 && d.front() != sep.bos_id) out.push_back(sep.bos_id);
    out.insert(out.end(), d.begin(), d.end());
    if (sep.eos_id >= 0 && d.back() != sep.eos_id) out.push_back(sep.eos_id);
  }
  return out;
}

std::vector<int64_t> read_all(const TokenDocuments& t) {
  std::vector<int64_t> out(static_cast<size_t>(t.size()));
  t.read(0, t.size(), out.data());
  return out;
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// An .idx image built field by field, so each test can break one field.
struct IdxImage {
  std::string magic = std::string("MMIDIDX\0\0", 9);
  uint64_t version = 1;
  uint8_t code = 8;
  std::vector<int32_t> lengths = {3, 0, 2};
  std::vector<int64_t> pointers = {0, 6, 6};
  std::vector<int64_t> docs = {0, 2, 3};
  int64_t extra_bytes = 0;

  std::string bytes() const {
    std::string s = magic;
    put(s, version);
    put(s, code);
    put(s, static_cast<uint64_t>(lengths.size()));
    put(s, static_cast<uint64_t>(docs.size()));
    for (auto v : lengths) put(s, v);
    for (auto v : pointers) put(s, v);
    for (auto v : docs) put(s, v);
    s.append(static_cast<size_t>(extra_bytes), '\0');
    return s;
  }
};

void expect_idx_error(const IdxImage& image, int64_t bin_bytes, const std::string& needle) {
  const std::string b = image.bytes();
  try {
    parse_megatron_index(reinterpret_cast<const unsigned char*>(b.data()), static_cast<int64_t>(b.size()), bin_bytes,
                         "x.idx");
    ADD_FAILURE() << "no error; expected one mentioning: " << needle;
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("x.idx"), std::string::npos) << msg;
  }
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace

TEST(MegatronIndexedDataset, ReadsWhatAPythonWriterInMegatronsLayoutWrote) {
  const std::string dir = temp_dir("megatron_roundtrip");
  for (const std::string dtype : {"uint16", "int32"}) {
    const int64_t vocab = dtype == "uint16" ? 65000 : 100000;
    const Docs docs = random_docs(60, vocab, 7);
    const std::string prefix = compat::join_path(dir, "c_" + dtype);
    python_write(prefix, docs, "megatron", dtype, nullptr, /*max_sequence=*/7);
    const auto t = open_megatron_dataset(prefix, {}, vocab);
    EXPECT_EQ(token_dtype_name(t->dtype()), dtype);
    EXPECT_EQ(t->documents(), 60);
    EXPECT_EQ(read_all(*t), reference_stream(docs, {}));
    // With separators: EOS after every non-empty document, BOS before it.
    const auto sep = open_megatron_dataset(prefix, {.bos_id = 1, .eos_id = 0}, vocab);
    EXPECT_EQ(read_all(*sep), reference_stream(docs, {.bos_id = 1, .eos_id = 0}));
  }
  compat::remove_all(dir);
}

TEST(FlatTokenFile, ReadsWhatThePythonWriterWroteInBothDtypes) {
  const std::string dir = temp_dir("flat_roundtrip");
  for (const std::string dtype : {"uint16", "uint32"}) {
    const int64_t vocab = dtype == "uint16" ? 65536 : 70000;
    const Docs docs = random_docs(30, vocab, 3);
    const std::string prefix = compat::join_path(dir, "f_" + dtype);
    python_write(prefix, docs, "bin", dtype);
    const auto t =
        open_flat_token_file(prefix + ".bin", dtype == "uint16" ? TokenDtype::kUInt16 : TokenDtype::kUInt32, vocab);
    EXPECT_EQ(read_all(*t), reference_stream(docs, {}));  // read as written: no separators added
    EXPECT_EQ(t->separators_added(), 0);
  }
  compat::remove_all(dir);
}

TEST(TokenDocuments, ReadsAtAnyOffsetEqualTheReferenceStream) {
  const std::string dir = temp_dir("offsets");
  const Docs docs = random_docs(50, 500, 11, 12);
  const std::string prefix = compat::join_path(dir, "c");
  python_write(prefix, docs, "megatron", "uint16");
  const DocumentSeparators sep{.bos_id = 1, .eos_id = 0};
  const auto t = open_megatron_dataset(prefix, sep, 500);
  const auto ref = reference_stream(docs, sep);
  ASSERT_EQ(t->size(), static_cast<int64_t>(ref.size()));
  std::mt19937 rng(5);
  for (int k = 0; k < 500; ++k) {
    const int64_t begin = rng() % ref.size();
    const int64_t n = rng() % (ref.size() - begin + 1);
    std::vector<int64_t> got(static_cast<size_t>(n));
    t->read(begin, n, got.data());
    ASSERT_TRUE(std::equal(got.begin(), got.end(), ref.begin() + begin)) << "read(" << begin << ", " << n << ")";
  }
  compat::remove_all(dir);
}

TEST(TokenDocuments, SeparatorsAlreadyInTheFileAreNotDoubled) {
  const std::string dir = temp_dir("already");
  // Megatron's --append-eod writes the EOS into each document; a tokenizer may add BOS.
  const Docs docs = {{1, 5, 6, 0}, {1, 7, 0}, {8, 9}, {}, {1, 4}};
  const std::string prefix = compat::join_path(dir, "c");
  python_write(prefix, docs, "megatron", "uint16");
  const auto t = open_megatron_dataset(prefix, {.bos_id = 1, .eos_id = 0}, 16);
  EXPECT_EQ(read_all(*t), (std::vector<int64_t>{1, 5, 6, 0, 1, 7, 0, 1, 8, 9, 0, 1, 4, 0}));
  EXPECT_EQ(t->separators_added(), 3);  // BOS + EOS around {8, 9}, EOS after {1, 4}
  compat::remove_all(dir);
}

// The defect: windows crossing documents saw no separator. Documents here use
// disjoint id ranges, so two neighbouring ids from different documents are a crossing.
TEST(TokenWindows, AWindowCrossingDocumentsAlwaysSeesAnEosBetweenThem) {
  const std::string dir = temp_dir("crossing");
  Docs docs;
  for (int d = 0; d < 40; ++d) docs.push_back(std::vector<int64_t>(5 + d % 7, 0));
  for (int d = 0; d < 40; ++d) {
    for (size_t i = 0; i < docs[d].size(); ++i) docs[d][i] = 10 + d * 20 + static_cast<int64_t>(i);
  }
  const std::string prefix = compat::join_path(dir, "c");
  python_write(prefix, docs, "megatron", "uint16");
  const auto t = open_megatron_dataset(prefix, {.eos_id = 0}, 1000);
  const TokenWindows windows(t, 0, t->size(), 4, 16, 3);
  int crossings = 0;
  for (int64_t step = 0; step < 20; ++step) {
    const Batch b = windows.batch_at(step);
    const auto in = b.input.contiguous();
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t i = 0; i + 1 < 16; ++i) {
        const int64_t a = in[r][i].item<int64_t>(), c = in[r][i + 1].item<int64_t>();
        if (a == 0 || c == 0) {
          crossings += (a == 0);
          continue;
        }
        ASSERT_EQ((a - 10) / 20, (c - 10) / 20) << "ids " << a << " and " << c << " of different documents touch";
      }
    }
  }
  EXPECT_GT(crossings, 20);
  compat::remove_all(dir);
}

TEST(MegatronIndexedDataset, EveryMalformedFieldIsAnErrorNamingIt) {
  const IdxImage good;
  {
    const std::string b = good.bytes();
    const MegatronIndex idx =
        parse_megatron_index(reinterpret_cast<const unsigned char*>(b.data()), static_cast<int64_t>(b.size()), 10, "x");
    EXPECT_EQ(idx.document_token_starts, (std::vector<int64_t>{0, 3, 5}));
  }
  IdxImage i = good;
  i.magic[3] = 'X';
  expect_idx_error(i, 10, "magic");
  i = good, i.version = 2;
  expect_idx_error(i, 10, "version is 2");
  i = good, i.code = 7;
  expect_idx_error(i, 10, "floating-point");
  i = good, i.code = 9;
  expect_idx_error(i, 10, "dtype code 9");
  i = good, i.extra_bytes = 5;
  expect_idx_error(i, 10, "need");
  i = good, i.extra_bytes = 3;
  expect_idx_error(i, 10, "multimodal");
  i = good, i.lengths[1] = -1;
  expect_idx_error(i, 10, "sequence_lengths[1] = -1");
  i = good, i.pointers[2] = 8;
  expect_idx_error(i, 10, "sequence_pointers[2] = 8");
  expect_idx_error(good, 12, "the .bin file has 12");
  expect_idx_error(good, 8, "past the end of the .bin file");
  i = good, i.docs[0] = 1;
  expect_idx_error(i, 10, "document_indices[0] = 1");
  i = good, i.docs = {0, 3, 2};
  expect_idx_error(i, 10, "document_indices[2] = 2");
  i = good, i.docs = {0, 2};
  expect_idx_error(i, 10, "the last document index is 2");
  i = good, i.docs = {};
  expect_idx_error(i, 10, "document count is 0");
  // Truncated anywhere: a size error, never a read past the end.
  const std::string b = good.bytes();
  for (size_t n = 0; n < b.size(); ++n) {
    EXPECT_THROW(
        parse_megatron_index(reinterpret_cast<const unsigned char*>(b.data()), static_cast<int64_t>(n), 10, "x"),
        c10::Error)
        << n << " bytes";
  }
  // Counts far beyond the file: refused before any size arithmetic.
  std::string huge = b;
  std::memset(huge.data() + 18, 0xFF, 8);
  EXPECT_THROW(parse_megatron_index(reinterpret_cast<const unsigned char*>(huge.data()),
                                    static_cast<int64_t>(huge.size()), 10, "x"),
               c10::Error);
}

TEST(TokenDocuments, AnIdOutsideTheVocabularyIsAnErrorNamingFileAndOffset) {
  const std::string dir = temp_dir("range");
  const std::string prefix = compat::join_path(dir, "c");
  python_write(prefix, {{3, 4, 5}, {6, 99, 7}}, "megatron", "uint16");
  const auto t = open_megatron_dataset(prefix, {.eos_id = 0}, 50);
  std::vector<int64_t> out(8);
  t->read(0, 4, out.data());  // the first document and its EOS are fine
  const std::string msg = error_of([&] { t->read(0, 8, out.data()); });
  EXPECT_NE(msg.find(prefix + ".bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("token 4 (byte offset 8) is id 99"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { open_megatron_dataset(prefix, {.eos_id = 60}, 50); }).find("separator id 60"),
            std::string::npos);
  compat::remove_all(dir);
}

TEST(FlatTokenFile, SizeThatIsNotWholeTokensOrEmptyIsAnError) {
  const std::string dir = temp_dir("flat_errors");
  const std::string odd = compat::join_path(dir, "odd.bin"), empty = compat::join_path(dir, "empty.bin");
  write_bytes(odd, std::string(7, '\1'));
  write_bytes(empty, "");
  EXPECT_NE(error_of([&] { open_flat_token_file(odd, TokenDtype::kUInt16, 1000); }).find("7 bytes, not a whole number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { open_flat_token_file(empty, TokenDtype::kUInt32, 1000); }).find("is empty"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              open_flat_token_file(compat::join_path(dir, "missing.bin"), TokenDtype::kUInt16, 9);
            }).find("missing.bin"),
            std::string::npos);
  compat::remove_all(dir);
}

TEST(WindowPermutation, IsAPermutationDeterministicPerKey) {
  for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 16ull, 17ull, 1000ull, 4097ull}) {
    const WindowPermutation p(n, 42), again(n, 42), other(n, 43);
    std::vector<bool> seen(n, false);
    bool differs = false;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t x = p(i);
      ASSERT_LT(x, n);
      ASSERT_FALSE(seen[x]) << "n " << n << ": " << x << " twice";
      seen[x] = true;
      EXPECT_EQ(again(i), x);
      differs |= other(i) != x;
    }
    if (n >= 5) EXPECT_TRUE(differs) << "n " << n << ": keys 42 and 43 give the same order";
  }
}

TEST(TokenWindows, EachEpochVisitsEveryWindowOnceInAFreshOrder) {
  const std::string dir = temp_dir("epochs");
  const std::string prefix = compat::join_path(dir, "c");
  python_write(prefix, random_docs(30, 300, 2), "megatron", "uint16");
  const auto t = open_megatron_dataset(prefix, {.eos_id = 0}, 300);
  const int64_t seq = 8;
  const TokenWindows w(t, 0, t->size(), 3, seq, 9);
  const int64_t n = w.windows_per_epoch();
  EXPECT_EQ(n, (t->size() - 1) / seq);
  std::vector<int64_t> e0, e1;
  for (int64_t k = 0; k < n; ++k) e0.push_back(w.window_start(k));
  for (int64_t k = n; k < 2 * n; ++k) e1.push_back(w.window_start(k));
  EXPECT_NE(e0, e1);
  for (auto* e : {&e0, &e1}) {
    std::sort(e->begin(), e->end());
    for (int64_t k = 0; k < n; ++k) ASSERT_EQ((*e)[k], k * seq);
  }
  compat::remove_all(dir);
}

TEST(TokenWindows, BatchIsAPureFunctionOfSeedAndStepAndTargetsAreShifted) {
  const std::string dir = temp_dir("pure");
  const std::string prefix = compat::join_path(dir, "c");
  const Docs docs = random_docs(40, 300, 4);
  python_write(prefix, docs, "megatron", "uint16");
  const auto t = open_megatron_dataset(prefix, {.eos_id = 0}, 300);
  const auto ref = reference_stream(docs, {.eos_id = 0});
  const TokenWindows a(t, 0, t->size(), 4, 10, 1), b(t, 0, t->size(), 4, 10, 1), c(t, 0, t->size(), 4, 10, 2);
  const Batch late = a.batch_at(7);
  for (int64_t s = 0; s < 7; ++s) a.batch_at(s);
  EXPECT_TRUE(at::equal(a.batch_at(7).input, late.input));
  EXPECT_TRUE(at::equal(b.batch_at(7).input, late.input));
  EXPECT_FALSE(at::equal(c.batch_at(7).input, late.input));
  for (int64_t r = 0; r < 4; ++r) {
    const int64_t start = a.window_start(7 * 4 + r);
    for (int64_t i = 0; i < 10; ++i) {
      EXPECT_EQ(late.input[r][i].item<int64_t>(), ref[start + i]);
      EXPECT_EQ(late.target[r][i].item<int64_t>(), ref[start + i + 1]);
    }
  }
  compat::remove_all(dir);
}

TEST(TokenWindows, DataParallelRanksReadTheirRowsOfTheGlobalBatch) {
  const std::string dir = temp_dir("dp");
  const std::string prefix = compat::join_path(dir, "c");
  python_write(prefix, random_docs(40, 300, 6), "megatron", "uint16");
  const auto t = open_megatron_dataset(prefix, {.eos_id = 0}, 300);
  const TokenWindows global(t, 0, t->size(), 8, 6, 5);
  for (int64_t dp : {2, 4}) {
    for (int64_t step : {0, 3, 1000000}) {
      std::vector<at::Tensor> parts;
      for (int64_t r = 0; r < dp; ++r)
        parts.push_back(TokenWindows(t, 0, t->size(), 8, 6, 5, r, dp).batch_at(step).input);
      EXPECT_TRUE(at::equal(at::cat(parts), global.batch_at(step).input)) << "dp " << dp << ", step " << step;
    }
  }
  EXPECT_THROW(TokenWindows(t, 0, t->size(), 6, 6, 5, 0, 4), c10::Error);  // 6 rows over 4 ranks
  EXPECT_THROW(TokenWindows(t, 0, 6, 8, 6, 5), c10::Error);                // no window of 7 tokens
  compat::remove_all(dir);
}

TEST(PretokenizedCorpus, FormatIsDetectedAndTheSidecarIsCrossChecked) {
  const std::string dir = temp_dir("detect");
  const std::string mega = compat::join_path(dir, "m"), flat = compat::join_path(dir, "f"),
                    bare = compat::join_path(dir, "bare");
  const Docs docs = random_docs(60, 400, 8);
  python_write(mega, docs, "megatron", "uint16", {{"vocab_size", 400}, {"eos_id", 0}});
  python_write(flat, docs, "bin", "uint32", {{"vocab_size", 400}, {"eos_id", 0}});
  python_write(bare, docs, "bin", "uint16");
  for (const std::string& p : {mega, mega + ".bin", mega + ".idx"})
    EXPECT_EQ(resolve_data_format(p, "auto"), "megatron");
  EXPECT_EQ(resolve_data_format(flat + ".bin", "auto"), "bin_u32");
  EXPECT_EQ(resolve_data_format(compat::join_path(dir, "notes.txt"), "auto"), "text");
  EXPECT_NE(error_of([&] { resolve_data_format(bare + ".bin", "auto"); }).find("set training.data_format = bin_u16"),
            std::string::npos);
  EXPECT_EQ(resolve_data_format(bare + ".bin", "bin_u16"), "bin_u16");

  const PretokenizedCorpus m({.path = mega + ".bin", .vocab_size = 512, .min_split_tokens = 9});
  int64_t non_empty = 0;
  for (const auto& d : docs) non_empty += !d.empty();
  EXPECT_EQ(m.tokens()->separators_added(), non_empty);  // the sidecar's EOS after each document
  EXPECT_EQ(m.train_end(), m.tokens()->size() - m.tokens()->size() / 10);
  EXPECT_NE(m.describe().find("tokenizer test-tokenizer"), std::string::npos) << m.describe();
  const PretokenizedCorpus f({.path = flat + ".bin", .vocab_size = 400});
  EXPECT_EQ(f.tokens()->dtype(), TokenDtype::kUInt32);

  EXPECT_NE(error_of([&] { PretokenizedCorpus({.path = mega, .vocab_size = 300}); }).find("vocabulary of 400 ids"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              PretokenizedCorpus({.path = flat + ".bin", .format = "bin_u16", .vocab_size = 400});
            }).find("says dtype uint32"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              PretokenizedCorpus({.path = mega, .vocab_size = 400, .min_split_tokens = 100000});
            }).find("too short"),
            std::string::npos);
  // A Megatron dataset without a known EOS would run documents together: refused.
  python_write(bare, docs, "megatron", "uint16");
  EXPECT_NE(error_of([&] { PretokenizedCorpus({.path = bare, .vocab_size = 400}); }).find("set training.eos_id"),
            std::string::npos);
  EXPECT_EQ(PretokenizedCorpus({.path = bare, .vocab_size = 400, .eos_id = 0}).tokens()->documents(), 60);
  // A sidecar of another version of the corpus.
  nlohmann::json side = nlohmann::json::parse(read_bytes(mega + ".json"));
  side["tokens"] = side["tokens"].get<int64_t>() + 1;
  write_bytes(mega + ".json", side.dump());
  EXPECT_NE(error_of([&] { PretokenizedCorpus({.path = mega, .vocab_size = 400}); }).find("another version"),
            std::string::npos);
  write_bytes(mega + ".json", "{\"eos_id\": -3}");
  EXPECT_NE(error_of([&] { PretokenizedCorpus({.path = mega, .vocab_size = 400}); }).find("'eos_id'"),
            std::string::npos);
  compat::remove_all(dir);
}

TEST(PretokenizedCorpus, IdentityNamesFilesSizesAndContentHashes) {
  const std::string dir = temp_dir("identity");
  const std::string mega = compat::join_path(dir, "m");
  python_write(mega, random_docs(30, 400, 9), "megatron", "uint16", {{"vocab_size", 400}, {"eos_id", 0}});
  const CorpusIdentity id = PretokenizedCorpus({.path = mega, .vocab_size = 400}).identity();
  EXPECT_EQ(id.format, "megatron");
  ASSERT_EQ(id.files.size(), 2u);
  EXPECT_EQ(id.files[0], identify_file(mega + ".bin"));
  EXPECT_EQ(id.files[0].bytes, compat::file_size(mega + ".bin"));
  EXPECT_EQ(id.tokenizer, "test-tokenizer");
  EXPECT_EQ(id.eos_id, 0);
  EXPECT_EQ(to_json(id)["files"][1]["path"], mega + ".idx");
  // One token changed (same size): the content hash tells.
  std::string bin = read_bytes(mega + ".bin");
  bin[2] ^= 1;
  write_bytes(mega + ".bin", bin);
  const CorpusIdentity changed = PretokenizedCorpus({.path = mega, .vocab_size = 400}).identity();
  EXPECT_EQ(changed.files[0].bytes, id.files[0].bytes);
  EXPECT_NE(changed.files[0].crc32c, id.files[0].crc32c);
  EXPECT_NE(changed, id);
  compat::remove_all(dir);
}

namespace {

JobConfig megatron_job(const std::string& data, int64_t dp) {
  JobConfig c;
  c.dump_folder = temp_dir("train_dp" + std::to_string(dp));
  c.model.dim = 32;
  c.model.n_layers = 1;
  c.model.n_heads = 4;
  c.model.vocab_size = 301;
  c.model.multiple_of = 16;
  c.model.max_seq_len = 32;
  c.training.batch_size = 8;
  c.training.seq_len = 12;
  c.training.steps = 6;
  c.lr_scheduler.warmup_steps = 2;
  c.training.dtype = "float64";
  c.training.data = data;
  c.training.eos_id = 0;
  c.parallelism.data_parallel_degree = dp;
  c.validation.enable = true;
  c.validation.freq = 3;
  c.checkpoint.enable = false;
  c.metrics.enable_plot = false;
  return c;
}

}  // namespace

// End to end through the Trainer: DP 2 trains on the rows of the same global batches as
// DP 1 (float64: equal up to summation order), validation included, and a run saved
// after 3 steps and resumed continues with exactly the batches of a straight run.
TEST(PretokenizedTraining, MegatronCorpusTrainsTheSameAtDp1AndDp2AndResumesExactly) {
  const std::string dir = temp_dir("train");
  const std::string prefix = compat::join_path(dir, "corpus");
  python_write(prefix, random_docs(200, 300, 12, 30), "megatron", "uint16");
  const JobConfig one = megatron_job(prefix + ".bin", 1);
  const auto dp1 = train_steps(one, 1, 6);
  const JobConfig two = megatron_job(prefix + ".bin", 2);
  const auto dp2 = train_steps(two, 1, 6);
  ASSERT_EQ(dp1.size(), 6u);
  ASSERT_EQ(dp2.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(dp2[i].loss, dp1[i].loss, 1e-10 * dp1[i].loss) << "step " << i + 1;
    EXPECT_EQ(dp1[i].val_loss.has_value(), dp2[i].val_loss.has_value());
    if (dp1[i].val_loss) EXPECT_NEAR(*dp2[i].val_loss, *dp1[i].val_loss, 1e-10 * *dp1[i].val_loss);
  }

  JobConfig first = megatron_job(prefix + ".bin", 2);
  first.checkpoint.enable = true;
  train_steps(first, 1, 3, /*save=*/true);
  JobConfig second = first;
  second.checkpoint.resume = true;
  const auto rest = train_steps(second, 4, 6);
  ASSERT_EQ(rest.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rest[i].loss, dp2[3 + i].loss) << "step " << 4 + i;
  for (const std::string& folder : {one.dump_folder, two.dump_folder, first.dump_folder}) compat::remove_all(folder);
  compat::remove_all(dir);
}

TEST(PretokenizedTraining, TextCorpusRefusesSeparatorIds) {
  const std::string dir = temp_dir("text_eos");
  const std::string text = compat::join_path(dir, "notes.txt");
  std::string words;
  for (int i = 0; i < 400; ++i) words += "word" + std::to_string(i % 37) + " ";
  write_bytes(text, words);
  JobConfig c = megatron_job(text, 1);
  const std::string msg = error_of([&] { Trainer trainer(c); });  // one process, no group needed
  EXPECT_NE(msg.find("apply to pre-tokenized corpora only"), std::string::npos) << msg;
  compat::remove_all(c.dump_folder);
  compat::remove_all(dir);
}

// Probe: an id >= vocab at token 5 was caught only at step 12 of 80 (when its window was
// drawn), never in a 2-step run or in validation windows no step drew, and an id above
// the sidecar's vocabulary but below the model's trained silently. Every id is checked
// once at start, against the tighter vocabulary.
TEST(PretokenizedCorpus, EveryIdIsCheckedAtStartAgainstTheModelsAndTheSidecarsVocabulary) {
  const std::string dir = temp_dir("every_id");
  const std::string late = compat::join_path(dir, "late"), side = compat::join_path(dir, "side");
  Docs docs = random_docs(400, 300, 11);
  docs.back().push_back(299);
  docs.back().push_back(512);  // in the validation part, the stream's last tenth
  python_write(late, docs, "bin", "uint16", {{"vocab_size", 300}});
  std::string msg = error_of([&] { PretokenizedCorpus({.path = late + ".bin", .vocab_size = 400}); });
  EXPECT_NE(msg.find(late + ".bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("is id 512, outside [0, 300) (the tokenizer's vocab_size = 300 in " + late + ".json)"),
            std::string::npos)
      << msg;
  // Below the model's vocabulary, above the tokenizer's: the sidecar's limit catches it.
  Docs within = random_docs(50, 300, 12);
  within[3].push_back(350);
  python_write(side, within, "megatron", "int32", {{"vocab_size", 300}, {"eos_id", 0}});
  msg = error_of([&] { PretokenizedCorpus({.path = side, .vocab_size = 400}); });
  EXPECT_NE(msg.find("is id 350, outside [0, 300) (the tokenizer's vocab_size = 300"), std::string::npos) << msg;
  // Without a sidecar, the model's vocabulary.
  std::remove((side + ".json").c_str());
  msg = error_of([&] { PretokenizedCorpus({.path = side, .vocab_size = 351, .eos_id = 0}); });
  EXPECT_TRUE(msg.empty()) << msg;
  msg = error_of([&] { PretokenizedCorpus({.path = side, .vocab_size = 350, .eos_id = 0}); });
  EXPECT_NE(msg.find("is id 350, outside"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[0, 350)"), std::string::npos) << msg;
  compat::remove_all(dir);
}

// Probe: a missing flat .bin was reported as "dtype unknown"; an .idx without its .bin
// asked for eos_id first.
TEST(PretokenizedCorpus, AMissingFileIsNamedBeforeAnythingElse) {
  const std::string dir = temp_dir("missing");
  const std::string flat = compat::join_path(dir, "gone.bin"), mega = compat::join_path(dir, "m");
  std::string msg = error_of([&] { resolve_data_format(flat, "auto"); });
  EXPECT_NE(msg.find("training.data '" + flat + "' does not exist"), std::string::npos) << msg;
  python_write(mega, random_docs(20, 50, 3), "megatron", "uint16");
  std::remove((mega + ".bin").c_str());
  msg = error_of([&] { PretokenizedCorpus({.path = mega + ".idx", .vocab_size = 50}); });
  EXPECT_NE(msg.find(mega + ".bin does not exist"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("eos_id"), std::string::npos) << msg;
  compat::remove_all(dir);
}

// Probe: `truncate -s 4096 live.bin` under a running job killed a rank with a bare
// SIGBUS. A read of a mapped file's lost pages now names the file and exits with 1.
TEST(MappedFileDeathTest, AFileTruncatedWhileMappedIsNamedNotABareSigbus) {
  const std::string dir = temp_dir("sigbus");
  const std::string path = compat::join_path(dir, "live.bin");
  write_bytes(path, std::string(1 << 16, '\7'));
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        hyper_parallel::io::MappedFile file(path);
        ::truncate(path.c_str(), 4096);
        volatile unsigned char sink = file.data()[(1 << 16) - 1];
        (void)sink;
      },
      ::testing::ExitedWithCode(1), "live.bin' shrank while this process was reading it");
  // A SIGBUS outside every mapping goes to the disposition that was there before (the
  // default's signal; under ASan, its report): it kills, and names no file.
  EXPECT_EXIT(
      {
        hyper_parallel::io::MappedFile file(path);
        ::raise(SIGBUS);
      },
      [](int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; },
      ::testing::Not(::testing::HasSubstr("shrank")));
  compat::remove_all(dir);
}

// Probe: a uint32 corpus read with training.data_format = bin_u16 and no sidecar trained on
// the ids interleaved with zeros. The zero high halves give it away.
TEST(PretokenizedCorpus, AUint32CorpusReadAsUint16IsRefused) {
  const std::string dir = temp_dir("u32_as_u16");
  const std::string wide = compat::join_path(dir, "wide"), narrow = compat::join_path(dir, "narrow");
  python_write(wide, random_docs(200, 400, 5), "bin", "uint32");
  python_write(narrow, random_docs(200, 400, 5), "bin", "uint16");
  const std::string msg =
      error_of([&] { PretokenizedCorpus({.path = wide + ".bin", .format = "bin_u16", .vocab_size = 400}); });
  EXPECT_NE(msg.find("holds a zero at every odd position"), std::string::npos) << msg;
  EXPECT_NE(msg.find("training.data_format = bin_u32"), std::string::npos) << msg;
  EXPECT_EQ(error_of([&] { PretokenizedCorpus({.path = narrow + ".bin", .format = "bin_u16", .vocab_size = 400}); }),
            "");
  EXPECT_EQ(error_of([&] { PretokenizedCorpus({.path = wide + ".bin", .format = "bin_u32", .vocab_size = 400}); }), "");
  compat::remove_all(dir);
}

}  // namespace token_data_test
