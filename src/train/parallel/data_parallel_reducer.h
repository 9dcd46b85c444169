// Data parallelism's gradient exchange, as PyTorch's DDP does it: parameters are grouped
// into buckets of about `bucket_bytes`, in reverse registration order (roughly the order
// backward produces their gradients). A post-accumulate-grad hook on each parameter (run
// once its .grad is written, as DDP hooks the gradient accumulator) copies it into its
// bucket's flat buffer; once a bucket is complete it is summed over the replicas
// asynchronously while backward goes on. finish() waits for the buckets and writes the sums
// back into the parameters' .grad.
//
//   DataParallelReducer reducer(model->named_parameters(), mesh["dp"], 25 << 20);
//   for each micro-batch: if (last) reducer.arm(); loss.backward();
//   reducer.finish();
//
// Sum, not mean: the trainer divides each token's loss by the global token count (over
// replicas and micro-batches) before backward, so the summed gradient is the gradient of
// the global loss. Buckets are sent in a fixed order (bucket i after buckets < i), the same
// on every replica, whatever order the hooks run in. Bucket buffers of bfloat16 gradients
// are float32 (Gloo cannot sum bfloat16; it is also the more exact sum).
// With gradient accumulation only the last micro-batch's backward is armed: its hooks read
// .grad, the earlier micro-batches' gradients included, so the exchange still overlaps
// that backward.
// Gradient holders (bfloat16 training's float32 masters) keep that accumulated gradient
// and receive the sum in their own .grad, so a bfloat16 model's sums stay float32.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hyper_parallel/core/device_mesh.h"

namespace hyper_parallel::train {

class DataParallelReducer {
 public:
  // `dp_mesh`: the 1-D data-parallel mesh (the same parameters' shards on every member).
  // DTensor parameters are reduced through their local pieces.
  // `gradient_holders`: empty, or one tensor per parameter (same order, shape and layout,
  // e.g. float32 masters) whose .grad holds the earlier micro-batches' gradient and
  // receives the sum; the parameters' own .grad is then set to none by finish().
  DataParallelReducer(const torch::OrderedDict<std::string, at::Tensor>& named_parameters, DeviceMesh dp_mesh,
                      int64_t bucket_bytes, const std::vector<at::Tensor>& gradient_holders = {});
  ~DataParallelReducer();
  DataParallelReducer(const DataParallelReducer&) = delete;
  DataParallelReducer& operator=(const DataParallelReducer&) = delete;

  // The next backward is the step's last: its hooks fill and send the buckets.
  void arm();
  // Waits for every bucket and writes the sums into .grad (the holders'). A parameter that got no
  // gradient in the armed backward is an error naming it (every replica must send the
  // same buckets).
  void finish();

  int64_t bucket_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyper_parallel::train
