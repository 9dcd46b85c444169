// Parity of a model family with transformers: tests/hf/make_<family>_models.py saves tiny
// random models offline with transformers' logits, loss and gradients (hf_reference.py);
// these helpers load one into the family's module at a TP degree (ranks as threads) and
// compare everything, gradients mapped back to Hugging Face names. transformers' logits
// are after a family's final soft-capping (Gemma 2's): ours are compared capped, and the
// loss caps them (loss_parallel's logit_softcap under TP).
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "harness/hf_models.h"
#include "hyper_parallel/models/hf_checkpoint.h"

namespace hyper_parallel::testing {

struct HfParityCase {
  std::string family;  // model_family(name)
  std::string folder;  // one case of hf_models(...).dir
  at::ScalarType dtype = at::kDouble;
  int64_t tp = 1;
  bool sequence_parallel = false;
  double tol = 1e-10;                            // every comparison is EXPECTed within it
  std::function<void(HfAdapter&)> edit_adapter;  // to show that a mapping matters
};
struct HfDifferences {
  // Largest |ours - transformers'| on rank 0; NaN until rank 0 has compared (a case whose
  // ranks threw prints NaN, not 0).
  double logits = std::nan(""), loss = std::nan(""), grads = 0;
};
HfDifferences run_hf_parity_case(const HfParityCase& c);

// Every case at TP 1, 2 and 4 (and with sequence parallel at 2 and 4 when asked), printing
// the differences; skips when hf_models(script) could not be made.
void check_hf_parity(const std::string& family, const std::string& script, const std::vector<std::string>& cases,
                     at::ScalarType dtype, double tol, bool with_sequence_parallel = false);

}  // namespace hyper_parallel::testing
