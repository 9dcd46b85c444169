// The C interface's inputs (internal): each hpk_* call's arguments checked, with an error that
// names what was expected and what was found (KernelError, kernel_error.h), and made into the
// arrays the kernels and the raw combine take, in the compute type acc_t (float or double).
// The checks read only what every rank holds alike (dtypes, shapes, targets, weights, options),
// so every rank fails alike.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

#include "hyper_parallel_kernels/loss_kernels.h"

namespace hyper_parallel::kernels_c {

// The logits' dtype as the kernels name it (a logits dtype, checked before).
c10::ScalarType scalar_type_of(int32_t dtype);

// Throws unless `pointer` is set, naming it.
void require(const void* pointer, const char* name);

// The piece's dtype, sizes and strides (logits.data required when `reads_data` and not empty).
void check_logits(const hpk_logits& logits, bool reads_data);
// A row stride given as 0 (meaning `cols`) or >= cols, for `rows` rows; returns the stride.
int64_t row_stride_of(int64_t stride, int64_t rows, int64_t cols, const char* name);

// A cross-entropy's options, targets' kind and dtype, and weights' dtype and length (not the
// targets' values: prepare_cross_entropy reads those).
void check_cross_entropy(const hpk_cross_entropy& ce, bool reads_logits);
void check_logprobs(const hpk_logprobs& lp, bool reads_logits);

// A cross-entropy's targets and weights as the kernels take them.
template <typename acc_t>
struct CrossEntropyInputs {
  std::vector<int64_t> target_col;  // index targets: the local column of a target this rank owns, else -1
  std::vector<uint8_t> valid;       // index targets: 1 for counted rows, 0 for ignored ones
  std::vector<acc_t> row_weight;    // index targets: w[t] (1 without weights), 0 for ignored rows
  std::vector<acc_t> local_weight;  // this rank's classes' weights, or empty (all 1)
  double weight_sum = 0;            // sum of all weights (C without weights)
  const acc_t* q = nullptr;         // probability targets in acc_t, row stride ldq
  int64_t ldq = 0;
  std::vector<acc_t> q_storage;  // q when converted
};

// Reads and checks the index targets' values (every one in [0, C) or ignore_index).
// `with_probabilities`: q too (stats and backward read it; combine does not).
template <typename acc_t>
CrossEntropyInputs<acc_t> prepare_cross_entropy(const hpk_cross_entropy& ce, bool with_probabilities);

// The log-probabilities' targets: local columns (-1 for another rank's or ignored) and counted rows.
struct LogprobsInputs {
  std::vector<int64_t> target_col;
  std::vector<uint8_t> valid;
};
LogprobsInputs prepare_logprobs(const hpk_logprobs& lp);

}  // namespace hyper_parallel::kernels_c
