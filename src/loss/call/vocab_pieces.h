// The members' torch.chunk pieces of a vocabulary (internal; vocab_piece itself is public in
// vocab_parallel.h): which classes a member holds, and whether the members' counts make up the
// vocabulary. The call agreement learns vocabularies with them, the front ends place pieces.
#pragma once

#include <cstdint>
#include <vector>

#include "hyper_parallel/loss/vocab_parallel.h"  // VocabPiece, vocab_piece

namespace hyper_parallel {

// Throws LossParallelLayoutError, the same on every member, unless `counts` (every member's
// class count) are torch.chunk's pieces of `vocab_size` classes; vocab_size < 0: of their sum.
// Returns the vocabulary.
int64_t check_vocab_pieces(const std::vector<int64_t>& counts, int64_t vocab_size);

}  // namespace hyper_parallel
