// What a model's forward tells a parameter manager about its progress, so that sharded
// data parallelism (fully_shard.h) can gather a block's parameters just before the block
// reads them and free them after: C++ modules have no forward hooks, so a model that
// supports this calls these itself (Llama::set_block_hooks).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  // Before the forward reads any parameter (the embeddings, and later the final norm and
  // the head, belong to the root: read until the end of backward).
  virtual void before_forward() = 0;
  // Around transformer block `index`; `output` is what it returned (its gradient arrives
  // just before the block's own backward runs).
  virtual void before_block(int64_t index) = 0;
  virtual void after_block(int64_t index, const at::Tensor& output) = 0;
};

}  // namespace hyper_parallel

HP_PUBLIC_END
