// checkpoint_reshard.cpp — which saved files a rank reads, and the copies of their overlaps.
#include "train/checkpoint/checkpoint_reshard.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <set>
#include <stdexcept>

namespace hyper_parallel::train {
namespace {

// The overlap of two parts of the same tensor; nullopt-like empty sizes when none.
bool overlap(const Box& a, const Box& b, Box* out) {
  out->offset.assign(a.offset.size(), 0);
  out->sizes.assign(a.offset.size(), 0);
  for (size_t d = 0; d < a.offset.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.sizes[d], b.offset[d] + b.sizes[d]);
    if (hi <= lo) return false;
    out->offset[d] = lo;
    out->sizes[d] = hi - lo;
  }
  return true;  // a 0-dim tensor: the one element
}

// `t`'s elements of `part` (global coordinates), `t` holding the part at `origin`.
at::Tensor window(at::Tensor t, const Box& part, const Box& origin) {
  for (size_t d = 0; d < part.offset.size(); ++d) {
    t = t.narrow(static_cast<int64_t>(d), part.offset[d] - origin.offset[d], part.sizes[d]);
  }
  return t;
}

std::string describe(const TensorLayout& l) { return shape_string(l.shape) + " " + c10::toString(l.dtype); }

}  // namespace

std::vector<std::string> layout_mismatches(const LayoutTable& saved, const std::vector<ReshardTarget>& targets) {
  std::vector<std::string> out;
  for (const auto& t : targets) {
    const auto it = saved.find(t.key);
    if (it == saved.end()) {
      out.push_back("tensor " + t.key + ": not in the checkpoint, this job " + describe(t.layout));
    } else if (it->second.shape != t.layout.shape || it->second.dtype != t.layout.dtype) {
      out.push_back("tensor " + t.key + ": checkpoint " + describe(it->second) + ", this job " + describe(t.layout));
    }
  }
  return out;
}

ReshardPlan::ReshardPlan(LayoutTable saved, int64_t saved_tp, std::vector<ReshardTarget> targets,
                         int64_t preferred_rank, int64_t saved_shard)
    : saved_(std::move(saved)), saved_tp_(saved_tp), saved_pieces_(saved_tp * saved_shard) {
  if (saved_tp_ < 1 || saved_shard < 1 || preferred_rank < 0 || preferred_rank >= saved_pieces_) {
    throw std::invalid_argument("ReshardPlan: saved TP degree " + std::to_string(saved_tp_) + " x shard degree " +
                                std::to_string(saved_shard) + ", preferred rank " + std::to_string(preferred_rank) +
                                ": expected 0 <= rank < their product");
  }
  const auto mismatches = layout_mismatches(saved_, targets);
  if (!mismatches.empty()) {
    std::string text;
    for (const auto& m : mismatches) text += "\n  " + m;
    throw std::runtime_error("the checkpoint does not hold this model's tensors:" + text);
  }
  std::set<int64_t> sources;
  std::vector<size_t> replicated;
  for (auto& t : targets) {
    if (t.box.offset.size() != t.layout.shape.size() || t.box.sizes.size() != t.layout.shape.size()) {
      throw std::invalid_argument("ReshardPlan: tensor " + t.key + ": its part has " +
                                  std::to_string(t.box.sizes.size()) + " dims, its shape " +
                                  shape_string(t.layout.shape));
    }
    Part p{std::move(t), {}, {}, 0};
    p.value = at::empty(p.target.box.sizes, at::TensorOptions().dtype(p.target.layout.dtype));
    const TensorLayout& from = saved_.at(p.target.key);
    if (p.target.box.numel() > 0 && is_whole(from)) {
      replicated.push_back(parts_.size());
    } else if (p.target.box.numel() > 0) {
      // Pieces that hold the same part (FSDP's shards of a tensor TP replicates: every TP
      // rank of a dp_shard rank) are read once, from the first file starting at the
      // preferred one, which the rank opens anyway when the layout is unchanged.
      Box common;
      std::vector<Box> taken;
      for (int64_t k = 0; k < saved_pieces_; ++k) {
        const int64_t r = (preferred_rank + k) % saved_pieces_;
        const Box piece = piece_of(from, saved_tp_, r);
        if (!overlap(p.target.box, piece, &common)) continue;
        if (std::any_of(taken.begin(), taken.end(),
                        [&](const Box& b) { return b.offset == piece.offset && b.sizes == piece.sizes; }))
          continue;
        taken.push_back(piece);
        p.from.push_back(r);
      }
      std::sort(p.from.begin(), p.from.end());
      sources.insert(p.from.begin(), p.from.end());
    }
    parts_.push_back(std::move(p));
  }
  // A whole saved tensor is in every saved file: take it from one this rank opens anyway.
  const int64_t whole_from = sources.empty() || sources.count(preferred_rank) ? preferred_rank : *sources.begin();
  for (size_t i : replicated) parts_[i].from = {whole_from};
  if (!replicated.empty()) sources.insert(whole_from);
  sources_.assign(sources.begin(), sources.end());
}

void ReshardPlan::take(int64_t saved_rank, const std::map<std::string, at::Tensor>& tensors, const std::string& path) {
  for (auto& p : parts_) {
    if (std::find(p.from.begin(), p.from.end(), saved_rank) == p.from.end()) continue;
    const TensorLayout& from = saved_.at(p.target.key);
    const Box piece = piece_of(from, saved_tp_, saved_rank);
    const auto it = tensors.find(p.target.key);
    if (it == tensors.end()) {
      throw std::runtime_error("checkpoint file '" + path + "' has no tensor " + p.target.key +
                               ", which the manifest's layout records");
    }
    if (it->second.sizes().vec() != piece.sizes || it->second.scalar_type() != from.dtype) {
      throw std::runtime_error(
          "checkpoint file '" + path + "': tensor " + p.target.key + " is " + shape_string(it->second.sizes().vec()) +
          " " + c10::toString(it->second.scalar_type()) + ", but the manifest's layout (" + describe(from) + ", " +
          placement_string(from) + " over " + std::to_string(saved_tp_) + " TP ranks" +
          (from.dim0_shards > 1 ? ", dim 0 over " + std::to_string(from.dim0_shards) + " FSDP ranks" : "") +
          ") gives rank " + std::to_string(saved_rank) + " a piece " + shape_string(piece.sizes) + " " +
          c10::toString(from.dtype));
    }
    Box common;
    if (!overlap(p.target.box, piece, &common)) continue;
    window(p.value, common, p.target.box).copy_(window(it->second, common, piece));
    p.filled += common.numel();
  }
}

std::map<std::string, at::Tensor> ReshardPlan::finish() {
  std::map<std::string, at::Tensor> out;
  for (auto& p : parts_) {
    // The pieces of a sharded tensor are disjoint, and a whole one comes from one file:
    // the element count proves every element was written exactly once.
    if (p.filled != p.target.box.numel()) {
      throw std::runtime_error("resharding the checkpoint: tensor " + p.target.key + ": " + std::to_string(p.filled) +
                               " of its " + std::to_string(p.target.box.numel()) +
                               " elements on this rank were read (the file of a saved rank it needs was not taken)");
    }
    out.emplace(p.target.key, std::move(p.value));
  }
  parts_.clear();
  return out;
}

}  // namespace hyper_parallel::train
