// The Qwen3 family: transformers' Qwen3ForCausalLM checkpoints (tests/hf/make_qwen_models.py,
// tiny random models made offline) loaded at TP 1, 2 and 4 and with sequence parallel
// (ranks as threads): logits, loss and every gradient, mapped back to Hugging Face names,
// agree with transformers' within 1e-10 in float64 and 1e-5 in float32. Also: its config
// fields read or refused by name, and `model.name = "qwen3"` selecting it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <limits>

#include "compat/file_system.h"
#include "harness/hf_parity.h"
#include "harness/scratch_folder.h"
#include "hyper_parallel/models/model_registry.h"
#include "hyper_parallel/models/qwen3.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/trainer.h"

namespace hf_qwen3_test {

using namespace hyper_parallel;
using hyper_parallel::testing::check_hf_parity;
using hyper_parallel::testing::hf_models;
using ::testing::HasSubstr;

namespace {

const char* kScript = "make_qwen_models.py";
const std::vector<std::string> kCases = {"gqa", "tied", "bf16_sharded"};

std::string qwen3_config(const std::string& extra) {
  return R"({"model_type": "qwen3", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 11, "intermediate_size": 24, "head_dim": 8)" +
         extra + "}";
}

std::string qwen3_config_error(const std::string& json) {
  try {
    qwen3_args_from_hf_config_json(json);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(HfQwen3Parity, Float64LogitsLossAndGradientsMatchTransformersWithin1e10AtTP1To4AndSP) {
  check_hf_parity("qwen3", kScript, kCases, at::kDouble, 1e-10, /*with_sequence_parallel=*/true);
}

TEST(HfQwen3Parity, Float32LogitsLossAndGradientsMatchTransformersWithin1e5AtTP1To4AndSP) {
  check_hf_parity("qwen3", kScript, kCases, at::kFloat, 1e-5, /*with_sequence_parallel=*/true);
}

// The q/k norms scale each element of a head, whose elements we keep in RoPE pair order:
// loaded without the permutation their weights land on the wrong elements.
TEST(HfQwen3Parity, QkNormWeightsLoadedWithoutTheRopePermutationGiveOtherLogits) {
  const auto& models = hf_models(kScript);
  if (!models.skip_reason.empty()) GTEST_SKIP() << models.skip_reason;
  hyper_parallel::testing::HfParityCase c{
      "qwen3",
      compat::join_path(models.dir, "gqa"),
      at::kDouble,
      1,
      false,
      std::numeric_limits<double>::infinity(),
      [](HfAdapter& adapter) {
        for (auto& m : adapter) {
          if (m.hf.find("_norm.weight") != std::string::npos && m.hf.find("self_attn") != std::string::npos) {
            m.rope_head_dim = 0;
          }
        }
      }};
  EXPECT_GT(hyper_parallel::testing::run_hf_parity_case(c).logits, 1e-3);
}

TEST(HfQwen3Config, FieldsAreReadAndUnrepresentableOnesRefusedByName) {
  const LlamaArgs a = qwen3_args_from_hf_config_json(qwen3_config(
      R"(, "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "use_sliding_window": false, "sliding_window": null,
         "max_window_layers": 28, "layer_types": ["full_attention"], "attention_bias": false,
         "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0})"));
  EXPECT_TRUE(qwen3_block_options(a).attention.qk_norm);
  EXPECT_EQ(a.resolved_kv_heads(), 2);
  EXPECT_EQ(a.resolved_head_dim(), 8);
  EXPECT_EQ(a.norm_eps, 1e-6);
  EXPECT_EQ(a.rope_theta, 1e6);
  EXPECT_TRUE(a.tie_word_embeddings);
  EXPECT_TRUE(a.rope_tables_like_hf);
  // Qwen3Config's defaults, not LlamaConfig's: head_dim 128 (not hidden / heads), 32768 positions.
  const LlamaArgs d = qwen3_args_from_hf_config_json(
      R"({"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 11, "intermediate_size": 24})");
  EXPECT_EQ(d.resolved_head_dim(), 128);
  EXPECT_EQ(d.max_seq_len, 32768);
  EXPECT_FALSE(
      llama_block_options(LlamaArgs::from_hf_config_json(qwen3_config(""), "config.json", "qwen3")).attention.qk_norm);

  EXPECT_THAT(qwen3_config_error(qwen3_config(R"(, "use_sliding_window": true, "sliding_window": 4096)")),
              HasSubstr("config.json: use_sliding_window = true: sliding-window attention is not implemented"));
  EXPECT_THAT(qwen3_config_error(qwen3_config(R"(, "layer_types": ["full_attention", "sliding_attention"])")),
              HasSubstr("layer_types[1] = \"sliding_attention\": only full_attention is implemented"));
  EXPECT_THAT(qwen3_config_error(qwen3_config(R"(, "attention_bias": true)")), HasSubstr("attention_bias = true"));
  EXPECT_THAT(qwen3_config_error(qwen3_config(R"(, "hidden_act": "gelu")")), HasSubstr("hidden_act = \"gelu\""));
  EXPECT_THAT(qwen3_config_error(qwen3_config(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 4.0})")),
              HasSubstr("rope_parameters.rope_type = \"yarn\": supported rope types: default, llama3"));
  EXPECT_THAT(qwen3_config_error(qwen3_config(R"(, "model_type": "qwen2")")),
              HasSubstr("model_type = \"qwen2\": the qwen3 family reads model_type \"qwen3\""));
  EXPECT_THAT(qwen3_config_error("{not json"), HasSubstr("config.json: not valid JSON"));
  // A Llama config is no Qwen3 config, and the other way round.
  EXPECT_THAT(qwen3_config_error(R"({"model_type": "llama"})"), HasSubstr("model_type = \"llama\""));
  try {
    LlamaArgs::from_hf_config_json(qwen3_config(""));
    ADD_FAILURE() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("model_type = \"qwen3\": the llama family reads model_type \"llama\""));
  }
}

TEST(ModelRegistry, Qwen3IsListedAndModelNameSelectsIt) {
  // The library's families first (a test may have registered more in this process).
  const std::vector<std::string> names = model_family_names();
  ASSERT_GE(names.size(), 3u);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 3),
            (std::vector<std::string>{"llama", "qwen3", "gemma2"}));
  EXPECT_EQ(model_family("qwen3").name, "qwen3");
  train::JobConfig cfg;
  cfg.model.name = "qwen3";
  EXPECT_NO_THROW(train::validate(cfg));
  // Sizes from [model] alone build a Llama: qwen3 without its config.json is refused rather
  // than trained as a Llama under that name.
  try {
    train::train_spec(cfg.model.name).build(cfg.model);
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.name = \"qwen3\" needs model.hf_assets_path"));
  }
  const std::string folder = hyper_parallel::testing::scratch_path("qwen3_registry");
  compat::create_directories(folder);
  std::ofstream(folder + "/config.json") << qwen3_config("");
  cfg.model.hf_assets_path = folder;  // the trainer's model: the family's, from its config.json
  EXPECT_TRUE(as_qwen3(*train::train_spec(cfg.model.name).build(cfg.model))->block_options().attention.qk_norm);
  auto module = model_family("qwen3").from_hf_config(folder + "/config.json");
  const Qwen3 model = as_qwen3(*module);
  EXPECT_THROW(as_llama(*module), c10::Error);  // the decoder shell with Qwen3's blocks, no Llama
  EXPECT_TRUE(model->block_options().attention.qk_norm);
  const auto params = model->named_parameters();
  EXPECT_TRUE(params.contains("layers.0.attention.q_norm.weight"));
  EXPECT_EQ(params["layers.0.attention.k_norm.weight"].sizes().vec(), std::vector<int64_t>{8});
  EXPECT_EQ(model_family("qwen3").hf_adapter(*module).size(), params.size());
}

}  // namespace hf_qwen3_test
