// checkpoint_reshard.h — building this rank's shards from a checkpoint saved at another
// tensor-parallel degree.
//
// The saved layout (checkpoint_layout.h, from the manifest) says which part of every
// tensor each saved TP rank holds; a target is the part this rank needs now (its piece
// at the current degree). The plan lists the saved TP ranks whose files overlap some
// target, so a rank opens only those (just its own when the degree is unchanged); each
// file handed to take() fills the overlaps; finish() proves every element was filled.
//
//   ReshardPlan plan(saved_table, saved_tp, targets, tp_rank % saved_tp);
//   for (int64_t r : plan.sources()) plan.take(r, read_verified(...r...).tensors, path_of(r));
//   auto tensors = plan.finish();   // by target key
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "train/checkpoint/checkpoint_layout.h"

namespace hyper_parallel::train {

// One tensor this rank builds: its key in the checkpoint, its layout in this job and
// the part of it this rank holds (piece_of(layout, tp, tp_rank)).
struct ReshardTarget {
  std::string key;
  TensorLayout layout;
  Box box;
};

// Each target whose tensor the checkpoint lacks, or holds with another global shape or
// dtype: "tensor <key>: checkpoint [515, 32] Float, this job [515, 48] Float".
std::vector<std::string> layout_mismatches(const LayoutTable& saved, const std::vector<ReshardTarget>& targets);

class ReshardPlan {
 public:
  // `saved`: the checkpoint's layouts at TP degree `saved_tp`. A Replicate() tensor is
  // read from one saved rank: `preferred_rank` unless this rank reads another file for a
  // sharded tensor anyway. Throws std::runtime_error listing layout_mismatches.
  // Saved with FSDP (saved_shard > 1): "saved TP ranks" are the saved pieces of a replica,
  // 0 .. saved_shard x saved_tp - 1 (piece_of).
  ReshardPlan(LayoutTable saved, int64_t saved_tp, std::vector<ReshardTarget> targets, int64_t preferred_rank,
              int64_t saved_shard = 1);

  // The saved TP ranks whose files this rank must read, ascending.
  const std::vector<int64_t>& sources() const { return sources_; }

  // Copies what the file of saved TP rank `saved_rank` (its tensors; `path` for errors)
  // holds of each target. Throws std::runtime_error naming the file and the tensor when
  // it lacks one or holds a piece of another shape or dtype than the layout says.
  void take(int64_t saved_rank, const std::map<std::string, at::Tensor>& tensors, const std::string& path);

  // The targets, by key (CPU, contiguous); throws when a part of one was never taken.
  std::map<std::string, at::Tensor> finish();

 private:
  struct Part {
    ReshardTarget target;
    std::vector<int64_t> from;  // saved TP ranks to copy from
    at::Tensor value;
    int64_t filled = 0;
  };
  LayoutTable saved_;
  int64_t saved_tp_;
  int64_t saved_pieces_;  // files per replica: saved_shard x saved_tp
  std::vector<Part> parts_;
  std::vector<int64_t> sources_;
};

}  // namespace hyper_parallel::train
