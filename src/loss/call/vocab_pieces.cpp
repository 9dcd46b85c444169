// vocab_pieces.h, and vocab_parallel.h's vocab_piece: the torch.chunk pieces of a vocabulary.
#include "loss/call/vocab_pieces.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/loss/loss_parallel.h"

namespace hyper_parallel {

namespace {

std::string piece_mismatch(const Communicator* comm, int64_t local, int64_t total) {
  const int64_t n = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
  const ChunkRange want = chunk_range(total, n, r);
  return "expected member " + std::to_string(r) + " of " + std::to_string(n) + " to hold classes [" +
         std::to_string(want.offset) + ", " + std::to_string(want.offset + want.length) + ") of the vocabulary of " +
         std::to_string(total) + " (its torch.chunk piece, as DTensor's Shard gives it), got " + std::to_string(local) +
         " classes";
}

}  // namespace

int64_t check_vocab_pieces(const std::vector<int64_t>& counts, int64_t vocab_size) {
  const int64_t n = static_cast<int64_t>(counts.size());
  int64_t total = vocab_size;
  if (total < 0) {
    total = 0;
    for (int64_t c : counts) total += c;
  }
  std::string listed;
  for (int64_t i = 0; i < n; ++i) listed += (i ? ", " : "") + std::to_string(counts[i]);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t want = chunk_range(total, n, i).length;
    if (want != counts[i]) {
      throw LossParallelLayoutError("vocab_parallel: the members' class counts (" + listed +
                                    ") are not the torch.chunk pieces of " + std::to_string(total) +
                                    " classes: member " + std::to_string(i) + " holds " + std::to_string(counts[i]) +
                                    ", expected " + std::to_string(want));
    }
  }
  return total;
}

VocabPiece vocab_piece(const Communicator* comm, int64_t local_classes, int64_t vocab_size) {
  const int64_t n = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
  int64_t total = vocab_size;
  if (total < 0) {
    if (n == 1) {
      total = local_classes;
    } else {
      const at::Tensor mine = at::full({1}, local_classes, at::TensorOptions().dtype(at::kLong));
      const at::Tensor all = comm->all_gather(mine, 0, std::vector<int64_t>(n, 1));
      std::vector<int64_t> counts(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) counts[i] = all[i].item<int64_t>();
      total = check_vocab_pieces(counts, -1);
    }
  }
  const ChunkRange want = chunk_range(total, n, r);
  if (want.length != local_classes)
    throw LossParallelLayoutError("vocab_parallel: " + piece_mismatch(comm, local_classes, total));
  return {want.offset, want.length, total};
}

ClassShard vocab_shard(const Communicator* comm, int64_t local_classes, int64_t vocab_size) {
  const VocabPiece piece = vocab_piece(comm, local_classes, vocab_size);
  return ClassShard{comm, piece.offset, piece.local, piece.total};
}

ClassShard backward_class_shard(const Communicator* comm, int64_t vocab_size, const std::string& op) {
  TORCH_CHECK_VALUE(vocab_size >= 0, op, ": expected the vocabulary size forward used");
  const int64_t n = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
  const ChunkRange range = chunk_range(vocab_size, n, r);
  return ClassShard{comm, range.offset, range.length, vocab_size};
}

}  // namespace hyper_parallel
