// The text corpus's word-level tokenizer, fed in pieces: the file is read in chunks and a
// word may straddle a chunk's end. Rules (batches.h, make_text_file_corpus): ASCII is lowercased; a word is a run of
// letters / digits / non-ASCII bytes (UTF-8 words stay whole), with an apostrophe kept
// inside a word ("don't"); every other visible character is a token of its own;
// whitespace and control characters separate.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace hyper_parallel::train {

class WordTokenizer {
 public:
  using Emit = std::function<void(std::string_view token)>;
  explicit WordTokenizer(Emit emit) : emit_(std::move(emit)) {}

  // The next bytes of the text.
  void feed(std::string_view bytes);
  // The end of the text: emits what is pending.
  void finish();

 private:
  void end_word();
  void other(unsigned char c);

  Emit emit_;
  std::string word_;                 // the word being read ("" outside a word)
  bool apostrophe_pending_ = false;  // the word was followed by ' : kept if a word byte follows
};

}  // namespace hyper_parallel::train
