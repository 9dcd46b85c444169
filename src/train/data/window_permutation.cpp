// WindowPermutation: each Feistel round is a bijection whatever its round function, so
// the network is one; SplitMix64's finaliser mixes the round function.
#include "train/data/window_permutation.h"

#include <c10/util/Exception.h>

namespace hyper_parallel::train {
namespace {

uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

WindowPermutation::WindowPermutation(uint64_t n, uint64_t key) : n_(n) {
  TORCH_CHECK(n >= 1, "WindowPermutation: n must be >= 1");
  int bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t k = mix(key);
  for (uint64_t& rk : round_keys_) rk = k = mix(k);
}

uint64_t WindowPermutation::feistel(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (const uint64_t rk : round_keys_) {
    const uint64_t next = left ^ (mix(right ^ rk) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t WindowPermutation::operator()(uint64_t i) const {
  TORCH_CHECK(i < n_, "WindowPermutation: index ", i, " is outside [0, ", n_, ")");
  uint64_t x = feistel(i);
  while (x >= n_) x = feistel(x);  // ends: i's cycle holds i itself, which is < n
  return x;
}

}  // namespace hyper_parallel::train
