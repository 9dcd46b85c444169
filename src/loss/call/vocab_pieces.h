// The members' torch.chunk pieces of a vocabulary (internal; vocab_piece itself is public in
// vocab_parallel.h): which classes a member holds, and whether the members' counts make up the
// vocabulary. The call agreement learns vocabularies with them, the front ends place pieces.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyper_parallel/loss/vocab_parallel.h"  // VocabPiece, vocab_piece
#include "loss/call/class_sharding.h"            // ClassShard

namespace hyper_parallel {

// Throws LossParallelLayoutError, the same on every member, unless `counts` (every member's
// class count) are torch.chunk's pieces of `vocab_size` classes; vocab_size < 0: of their sum.
// Returns the vocabulary.
int64_t check_vocab_pieces(const std::vector<int64_t>& counts, int64_t vocab_size);

// vocab_piece as the classes a kernel computes with (the same checks, the same collective).
ClassShard vocab_shard(const Communicator* comm, int64_t local_classes, int64_t vocab_size);

// A backward's classes: this member's torch.chunk piece of the vocabulary its forward used and
// checked, so no collective. Throws c10::ValueError naming `op` (the backward) when the
// vocabulary is not given (vocab_size < 0).
ClassShard backward_class_shard(const Communicator* comm, int64_t vocab_size, const std::string& op);

}  // namespace hyper_parallel
