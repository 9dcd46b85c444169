// PretokenizedCorpus: format resolution, the sidecar cross-checks, the 90/10 split.
#include "train/data/pretokenized_corpus.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>
#include <vector>

#include "compat/file_system.h"
#include "train/data/flat_token_file.h"
#include "train/data/megatron_indexed_dataset.h"
#include "train/data/token_windows.h"

namespace hyper_parallel::train {
std::string resolve_data_format(const std::string& path, const std::string& requested) {
  if (requested != "auto") {
    TORCH_CHECK(requested == "text" || requested == "bin_u16" || requested == "bin_u32" || requested == "megatron",
                "training.data_format = \"", requested, "\" is not one of auto, text, bin_u16, bin_u32, megatron");
    return requested;
  }
  const std::string prefix = corpus_prefix(path);
  const bool has_suffix = prefix != path;
  if (path.ends_with(".idx") ||
      (compat::path_exists(prefix + ".idx") && (has_suffix || compat::path_exists(prefix + ".bin")))) {
    return "megatron";
  }
  if (!path.ends_with(".bin")) return "text";
  TORCH_CHECK(compat::path_exists(path), "training.data '", path, "' does not exist");
  const auto sidecar = read_corpus_sidecar(path);
  TORCH_CHECK(sidecar && !sidecar->dtype.empty(), "training.data '", path,
              "' is a flat token file, but its dtype is unknown (no ", sidecar_path_for(path),
              " naming it): set training.data_format = bin_u16 or bin_u32");
  TORCH_CHECK(sidecar->dtype == "uint16" || sidecar->dtype == "uint32", "corpus sidecar '", sidecar->path,
              "': dtype \"", sidecar->dtype, "\" is not a flat token file's (uint16 or uint32)");
  return sidecar->dtype == "uint16" ? "bin_u16" : "bin_u32";
}

namespace {

// A uint32 corpus read as uint16 is every id followed by its high half, 0 below 65536: the
// ids interleaved with zeros, which trains without a complaint. A zero at every odd
// position of the first 64 Ki tokens (and not at every even one) gives it away.
void refuse_uint32_read_as_uint16(const TokenDocuments& tokens) {
  const int64_t n = std::min<int64_t>(tokens.file_tokens(), 1 << 16) & ~int64_t{1};
  if (n < 256) return;  // too few to tell
  std::vector<int64_t> ids(static_cast<size_t>(n));
  tokens.read(0, n, ids.data());
  bool odd_zero = true, even_zero = true;
  for (int64_t i = 0; i < n; i += 2) {
    even_zero = even_zero && ids[i] == 0;
    odd_zero = odd_zero && ids[i + 1] == 0;
  }
  TORCH_CHECK(!odd_zero || even_zero, "token file '", tokens.path(),
              "' read as uint16 (training.data_format = bin_u16) ", "holds a zero at every odd position of its first ",
              n,
              " tokens: it looks like a uint32 corpus, each id followed by its zero high half. Set "
              "training.data_format = bin_u32, or write a sidecar naming its dtype (scripts/tokenize_corpus.py does)");
}

}  // namespace

PretokenizedCorpus::PretokenizedCorpus(const PretokenizedCorpusOptions& options) : options_(options) {
  format_ = resolve_data_format(options.path, options.format);
  TORCH_CHECK(format_ != "text", "PretokenizedCorpus: '", options.path, "' is a text corpus");
  const bool megatron = format_ == "megatron";
  prefix_ = megatron ? corpus_prefix(options.path) : options.path;
  sidecar_ = read_corpus_sidecar(options.path);
  const std::string what = megatron ? "Megatron dataset '" + prefix_ + "'" : "token file '" + prefix_ + "'";
  if (sidecar_) {
    const CorpusSidecar& s = *sidecar_;
    TORCH_CHECK(s.format.empty() || s.format == (megatron ? "megatron" : "bin"), "corpus sidecar '", s.path,
                "' says format \"", s.format, "\", but training.data_format is ", format_);
    TORCH_CHECK(megatron || s.dtype.empty() || s.dtype == (format_ == "bin_u16" ? "uint16" : "uint32"),
                "corpus sidecar '", s.path, "' says dtype ", s.dtype, ", but training.data_format is ", format_);
    TORCH_CHECK(s.vocab_size <= options.vocab_size, what, " was tokenized with a vocabulary of ", s.vocab_size,
                " ids (", s.path, "), more than model.vocab_size = ", options.vocab_size);
  }
  separators_.eos_id = options.eos_id >= 0 ? options.eos_id : sidecar_ ? sidecar_->eos_id : -1;
  separators_.bos_id = options.bos_id >= 0 ? options.bos_id : sidecar_ ? sidecar_->bos_id : -1;
  for (const auto& [name, id] : {std::pair{"eos_id", separators_.eos_id}, std::pair{"bos_id", separators_.bos_id}}) {
    TORCH_CHECK(id < options.vocab_size, what, ": ", name, " ", id,
                " is not below model.vocab_size = ", options.vocab_size);
  }
  if (megatron) {
    // The files first: a missing one, not the EOS id, is then what is wrong.
    for (const char* suffix : {".bin", ".idx"}) {
      TORCH_CHECK(compat::path_exists(prefix_ + suffix), what, ": ", prefix_, suffix,
                  " does not exist (a Megatron dataset is PREFIX.bin and PREFIX.idx side by side)");
    }
    TORCH_CHECK(separators_.eos_id >= 0, what,
                " records document boundaries, but no end-of-document id is known: set training.eos_id "
                "(the tokenizer's EOS) so that windows crossing documents see a separator");
    tokens_ = open_megatron_dataset(prefix_, separators_, options.vocab_size);
    TORCH_CHECK(!sidecar_ || sidecar_->dtype.empty() || sidecar_->dtype == token_dtype_name(tokens_->dtype()),
                "corpus sidecar '", sidecar_->path, "' says dtype ", sidecar_->dtype, ", but ", prefix_, ".idx stores ",
                token_dtype_name(tokens_->dtype()));
  } else {
    tokens_ = open_flat_token_file(prefix_, format_ == "bin_u16" ? TokenDtype::kUInt16 : TokenDtype::kUInt32,
                                   options.vocab_size);
    if (format_ == "bin_u16") refuse_uint32_read_as_uint16(*tokens_);
  }
  if (sidecar_) {
    TORCH_CHECK(sidecar_->tokens < 0 || sidecar_->tokens == tokens_->file_tokens(), "corpus sidecar '", sidecar_->path,
                "' says ", sidecar_->tokens, " tokens, but ", what, " holds ", tokens_->file_tokens(),
                ": the sidecar belongs to another version of the corpus");
    TORCH_CHECK(!megatron || sidecar_->documents < 0 || sidecar_->documents == tokens_->documents(), "corpus sidecar '",
                sidecar_->path, "' says ", sidecar_->documents, " documents, but ", what, " holds ",
                tokens_->documents());
  }
  // Every id once, train and validation alike, against the tighter of the two vocabularies.
  if (sidecar_ && sidecar_->vocab_size > 0 && sidecar_->vocab_size < options.vocab_size) {
    tokens_->check_every_id(sidecar_->vocab_size, "the tokenizer's vocab_size = " +
                                                      std::to_string(sidecar_->vocab_size) + " in " + sidecar_->path);
  } else {
    tokens_->check_every_id(options.vocab_size, "model.vocab_size = " + std::to_string(options.vocab_size));
  }
  const int64_t n = tokens_->size();
  const int64_t n_val = n / 10;
  train_end_ = n - n_val;
  const int64_t need = std::max<int64_t>(options.min_split_tokens, 2);
  TORCH_CHECK(n_val >= need, what, " is too short: its ", n, " tokens give ", train_end_, " train + ", n_val,
              " validation tokens, but each part needs at least ", need, " (seq_len + 1)");
}

std::string PretokenizedCorpus::describe() const {
  std::ostringstream os;
  os << (format_ == "megatron" ? "Megatron dataset '" : "token file '") << prefix_ << "' (" << format_ << ", "
     << token_dtype_name(tokens_->dtype()) << "): " << train_end_ << " train + " << tokens_->size() - train_end_
     << " validation tokens";
  if (format_ == "megatron") {
    os << ", " << tokens_->documents() << " documents, " << tokens_->separators_added() << " separators added";
  } else {
    os << ", read as written (a flat file records no document boundaries)";
  }
  if (separators_.eos_id >= 0) os << ", eos " << separators_.eos_id;
  if (separators_.bos_id >= 0) os << ", bos " << separators_.bos_id;
  if (sidecar_ && !sidecar_->tokenizer.empty()) os << ", tokenizer " << sidecar_->tokenizer;
  os << ", vocab " << options_.vocab_size;
  return os.str();
}

CorpusIdentity PretokenizedCorpus::identity() const {
  CorpusIdentity id;
  id.format = format_;
  if (format_ == "megatron") {
    id.files = {identify_file(prefix_ + ".bin"), identify_file(prefix_ + ".idx")};
    id.documents = tokens_->documents();
  } else {
    id.files = {identify_file(prefix_)};
  }
  if (sidecar_) {
    id.tokenizer = sidecar_->tokenizer;
    id.tokenizer_sha256 = sidecar_->tokenizer_sha256;
  }
  id.dtype = token_dtype_name(tokens_->dtype());
  id.vocab_size = options_.vocab_size;
  id.eos_id = separators_.eos_id;
  id.bos_id = separators_.bos_id;
  id.tokens = tokens_->size();
  return id;
}

std::shared_ptr<const BatchSource> PretokenizedCorpus::train_batches(int64_t batch_size, int64_t seq_len, uint64_t seed,
                                                                     int64_t dp_rank, int64_t dp_size) const {
  return std::make_shared<TokenWindows>(tokens_, 0, train_end_, batch_size, seq_len, seed, dp_rank, dp_size);
}

std::shared_ptr<const BatchSource> PretokenizedCorpus::validation_batches(int64_t batch_size, int64_t seq_len,
                                                                          uint64_t seed, int64_t dp_rank,
                                                                          int64_t dp_size) const {
  return std::make_shared<TokenWindows>(tokens_, train_end_, tokens_->size(), batch_size, seq_len, seed, dp_rank,
                                        dp_size);
}

}  // namespace hyper_parallel::train
