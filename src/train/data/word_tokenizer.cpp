#include "train/data/word_tokenizer.h"

#include <cctype>

namespace hyper_parallel::train {

namespace {
bool is_word_byte(unsigned char c) { return std::isalnum(c) || c >= 0x80; }
}  // namespace

void WordTokenizer::end_word() {
  if (!word_.empty()) emit_(word_);
  word_.clear();
  if (apostrophe_pending_) emit_("'");  // not inside a word: a token of its own
  apostrophe_pending_ = false;
}

void WordTokenizer::other(unsigned char c) {
  const char ch = static_cast<char>(c);
  if (std::isgraph(c)) emit_(std::string_view(&ch, 1));
}

void WordTokenizer::feed(std::string_view bytes) {
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    if (is_word_byte(c)) {
      if (apostrophe_pending_) word_.push_back('\'');  // inside a word: "don't" stays one token
      apostrophe_pending_ = false;
      word_.push_back(static_cast<char>(std::tolower(c)));
    } else if (c == '\'' && !word_.empty() && !apostrophe_pending_) {
      apostrophe_pending_ = true;  // decided by the next byte, perhaps in the next chunk
    } else {
      end_word();
      other(c);
    }
  }
}

void WordTokenizer::finish() { end_word(); }

}  // namespace hyper_parallel::train
