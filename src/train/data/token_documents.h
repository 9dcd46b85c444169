// Pre-tokenized documents in a memory-mapped file, read as one token stream in which
// documents are separated: each document is preceded by a BOS and followed by an EOS id
// where those are configured and the document does not already start / end with them.
// A training window that crosses a document boundary thus always sees a separator, once,
// whether or not the tokenizer wrote one into the file (Megatron's --append-eod).
//
// The file is only mapped: a read touches the pages of the tokens it returns, so ranks
// reading their own windows never bring in the whole corpus. Memory is 17 bytes per
// document (virtual start, file start, separator flags).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hyper_parallel::io {
class MappedFile;
}  // namespace hyper_parallel::io

namespace hyper_parallel::train {

// How token ids are stored on disk (little-endian).
enum class TokenDtype { kUInt8, kInt8, kInt16, kUInt16, kInt32, kUInt32, kInt64 };
int64_t token_dtype_size(TokenDtype dtype);
// numpy's name: "uint16", "int32", ...
std::string token_dtype_name(TokenDtype dtype);

// Ids put between documents; -1: none.
struct DocumentSeparators {
  int64_t bos_id = -1;
  int64_t eos_id = -1;
};

class TokenDocuments {
 public:
  // The file's tokens from byte 0, in `dtype`; document d is tokens
  // [doc_starts[d], doc_starts[d + 1]) (non-decreasing; the last entry is the token
  // count). Every id read must be in [0, vocab_size): reads throw otherwise, naming the
  // file and the token's offset. Reads the first and last token of every document to
  // decide where separators go.
  TokenDocuments(std::shared_ptr<const io::MappedFile> file, TokenDtype dtype, std::vector<int64_t> doc_starts,
                 DocumentSeparators separators, int64_t vocab_size);

  // Tokens of the stream: the file's plus the separators added.
  int64_t size() const { return virtual_start_.back(); }
  int64_t documents() const { return static_cast<int64_t>(file_start_.size()) - 1; }
  int64_t file_tokens() const { return file_start_.back(); }
  int64_t separators_added() const { return size() - file_tokens(); }
  TokenDtype dtype() const { return dtype_; }
  const std::string& path() const;

  // Tokens [begin, begin + n) of the stream as int64 into out.
  void read(int64_t begin, int64_t n, int64_t* out) const;
  // Every id of the documents at once, against [0, limit): a bad id anywhere (in the
  // validation part, in windows no step draws) stops the job at start, naming the file, the
  // token and `limit_name` ("model.vocab_size = 32000"). Reads the whole file once.
  void check_every_id(int64_t limit, const std::string& limit_name) const;

 private:
  // Copies file tokens [begin, begin + n) into out, checking each id.
  void read_file_tokens(int64_t begin, int64_t n, int64_t* out) const;
  int64_t file_token(int64_t index) const;

  std::shared_ptr<const io::MappedFile> file_;
  TokenDtype dtype_;
  DocumentSeparators separators_;
  int64_t vocab_size_;
  std::vector<int64_t> file_start_;     // documents + 1 entries, token offsets in the file
  std::vector<int64_t> virtual_start_;  // documents + 1 entries, offsets in the stream
  std::vector<uint8_t> added_;          // per document: kBos | kEos when inserted
};

}  // namespace hyper_parallel::train
