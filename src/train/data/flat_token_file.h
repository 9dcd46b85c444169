// nanoGPT's pre-tokenized corpus: a flat file of little-endian token ids (uint16 for
// vocabularies up to 65536, else uint32), no header. Document boundaries are not
// recorded, so the file is read as written: separators must already be in it (nanoGPT's
// prepare.py and scripts/tokenize_corpus.py append an EOS to every document).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "train/data/token_documents.h"

namespace hyper_parallel::train {

// Maps `path`; throws naming it when it is empty or its size is not a whole number of
// `dtype` tokens. Ids are checked against vocab_size as they are read.
std::shared_ptr<const TokenDocuments> open_flat_token_file(const std::string& path, TokenDtype dtype,
                                                           int64_t vocab_size);

}  // namespace hyper_parallel::train
