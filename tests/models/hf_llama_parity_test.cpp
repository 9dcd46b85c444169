// Our Llama loaded from transformers checkpoints (tests/hf/make_llama_models.py makes tiny
// random LlamaForCausalLM models offline and records what transformers computes on them)
// at TP 1, 2 and 4 (ranks as threads): the logits, the loss and every parameter's
// gradient, mapped back to Hugging Face names, agree with transformers' within 1e-10 in
// float64 and 1e-5 in float32. The tied model's head is its embedding parameter, whose
// gradient is transformers' gradient of the tied weight. Skipped, saying why, when the venv
// has no transformers.
#include <gtest/gtest.h>

#include "harness/hf_parity.h"

namespace hf_llama_parity_test {

using hyper_parallel::testing::check_hf_parity;

namespace {
const std::vector<std::string> kCases = {"gqa", "tied", "llama3", "sharded", "bf16"};
}

TEST(HfLlamaParity, Float64LogitsLossAndGradientsMatchTransformersWithin1e10AtTP1To4) {
  check_hf_parity("llama", "make_llama_models.py", kCases, at::kDouble, 1e-10);
}

TEST(HfLlamaParity, Float32LogitsLossAndGradientsMatchTransformersWithin1e5AtTP1To4) {
  check_hf_parity("llama", "make_llama_models.py", kCases, at::kFloat, 1e-5);
}

}  // namespace hf_llama_parity_test
