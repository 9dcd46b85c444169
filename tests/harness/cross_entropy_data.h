// Random inputs of the cross-entropy tests, in float64: logits, index targets (a fraction of
// them ignored) or probability rows, and class weights. The same case and seed give the same
// data in every test, so that two tests of one loss (the LibTorch route, the C library) read
// the same numbers.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>

#include "harness/rank_harness.h"

namespace hyper_parallel::testing {

struct CrossEntropyData {
  at::Tensor logits;  // [rows, classes], float64
  at::Tensor target;  // index targets [rows] (int64, -100 where ignored) or probability rows [rows, classes]
  at::Tensor weight;  // [classes] in [0.5, 1.5), or undefined when unweighted
};

// `c` names rows, classes, soft (probability targets), ignored_fraction and weighted.
template <typename Case>
CrossEntropyData random_cross_entropy_data(const Case& c, uint64_t seed) {
  CrossEntropyData d;
  d.logits = random_tensor({c.rows, c.classes}, seed) * 4;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  if (c.soft) {
    d.target = at::softmax(random_tensor({c.rows, c.classes}, seed + 2) * 2, 1);
  } else {
    d.target = at::randint(c.classes, {c.rows}, gen, at::kLong);
    if (c.ignored_fraction > 0) d.target.masked_fill_(at::rand({c.rows}, gen, at::kDouble) < c.ignored_fraction, -100);
  }
  if (c.weighted) d.weight = at::rand({c.classes}, gen, at::kDouble) + 0.5;
  return d;
}

}  // namespace hyper_parallel::testing
