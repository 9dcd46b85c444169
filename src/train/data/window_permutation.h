// A keyed pseudo-random permutation of [0, n) evaluated one element at a time: a
// four-round Feistel network on the smallest even number of bits covering n, walked until
// it lands inside [0, n) (cycle walking; under 4 rounds of walking on average). O(1)
// memory and time per element, so an epoch's shuffled order over billions of windows
// needs no table, and element i of any epoch is reconstructible from i alone (resume).
#pragma once

#include <cstdint>

namespace hyper_parallel::train {

class WindowPermutation {
 public:
  // n >= 1; the same (n, key) always gives the same permutation.
  WindowPermutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t feistel(uint64_t x) const;

  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t round_keys_[4];
};

}  // namespace hyper_parallel::train
