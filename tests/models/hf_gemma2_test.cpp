// The Gemma 2 family: transformers' Gemma2ForCausalLM checkpoints (tests/hf/make_gemma2_models.py,
// tiny random models made offline, eager attention) loaded at TP 1, 2 and 4 and with
// sequence parallel (ranks as threads): logits (after the final soft-capping), loss and
// every gradient, mapped back to Hugging Face names, agree with transformers' within 1e-10
// in float64 and 1e-5 in float32. Also: the sliding window and the soft-caps change the
// logits (so the parity covers them), the config fields read or refused by name,
// deterministic initialisation, block hooks, the registry entry, and transformers'
// from_pretrained of our export giving the same logits.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>

#include "compat/file_system.h"
#include "harness/build_paths.h"
#include "harness/hf_parity.h"
#include "harness/rank_harness.h"
#include "harness/scratch_folder.h"
#include "hyper_parallel/nn/fully_shard.h"
#include "hyper_parallel/models/gemma2.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/models/llama.h"
#include "hyper_parallel/models/model_registry.h"
#include "hyper_parallel_train/spec/train_spec.h"

namespace hf_gemma2_test {

using namespace hyper_parallel;
using hyper_parallel::testing::check_hf_parity;
using hyper_parallel::testing::hf_models;
using hyper_parallel::testing::run_ranks;
using ::testing::HasSubstr;

namespace {

const char* kScript = "make_gemma2_models.py";
// gqa: Gemma 2's caps (50, 30), layers 0 and 2 sliding, untied; tied: saturating caps,
// another layer pattern; bf16_sharded: no caps, stored in bfloat16 and sharded. Every
// sliding window is shorter than the 12 tokens, and the tokens hold the padding id 0
// (whose embedding row gets no gradient from the lookup).
const std::vector<std::string> kCases = {"gqa", "tied", "bf16_sharded"};

std::string gemma2_config(const std::string& extra) {
  return R"({"model_type": "gemma2", "hidden_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 11, "intermediate_size": 24, "head_dim": 8)" +
         extra + "}";
}

std::string gemma2_config_error(const std::string& json) {
  try {
    Gemma2Args::from_hf_config_json(json);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

Gemma2Args tiny_args() { return Gemma2Args::from_hf_config_json(gemma2_config(R"(, "max_position_embeddings": 16)")); }

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// `case_name` of the models with its config.json edited, in a folder of its own.
std::string edited_case(const std::string& case_name, const std::string& key, const nlohmann::json& value) {
  const std::string source = compat::join_path(hf_models(kScript).dir, case_name);
  const std::string folder = hyper_parallel::testing::scratch_path("gemma2_edited/" + case_name + "_" + key);
  compat::create_directories(folder);
  for (const auto& f : compat::list_directory(source)) {
    std::ofstream(compat::join_path(folder, f), std::ios::binary) << file_bytes(compat::join_path(source, f));
  }
  nlohmann::json config = nlohmann::json::parse(file_bytes(source + "/config.json"));
  config[key] = value;
  std::ofstream(folder + "/config.json") << config.dump(2);
  return folder;
}

}  // namespace

TEST(HfGemma2Parity, Float64LogitsLossAndGradientsMatchTransformersWithin1e10AtTP1To4AndSP) {
  check_hf_parity("gemma2", kScript, kCases, at::kDouble, 1e-10, /*with_sequence_parallel=*/true);
}

TEST(HfGemma2Parity, Float32LogitsLossAndGradientsMatchTransformersWithin1e5AtTP1To4AndSP) {
  check_hf_parity("gemma2", kScript, kCases, at::kFloat, 1e-5, /*with_sequence_parallel=*/true);
}

// The parity above is only as good as the parts it exercises: the same checkpoint read
// with a wider window, without either cap, or with the head_dim scaling moves our logits
// away from transformers' by far more than its tolerance.
TEST(HfGemma2Parity, TheSlidingWindowTheSoftCapsAndTheScalingEachChangeTheLogits) {
  if (!hf_models(kScript).skip_reason.empty()) GTEST_SKIP() << hf_models(kScript).skip_reason;
  const std::vector<std::pair<std::string, nlohmann::json>> edits = {
      {"sliding_window", 64},
      {"attn_logit_softcapping", nullptr},
      {"final_logit_softcapping", nullptr},
      {"query_pre_attn_scalar", 16},
  };
  for (const auto& [key, value] : edits) {
    for (const char* name : {"gqa", "tied"}) {
      hyper_parallel::testing::HfParityCase c{"gemma2", edited_case(name, key, value),           at::kDouble, 1,
                                              false,    std::numeric_limits<double>::infinity(), {}};
      const double d = hyper_parallel::testing::run_hf_parity_case(c).logits;
      std::cout << "[ hf parity ] gemma2 " << name << " with " << key << " = " << value.dump() << ": max |d logits| "
                << d << "\n";
      EXPECT_GT(d, 1e-4) << name << " with " << key << " = " << value.dump();
    }
  }
}

// The tokens hold the padding id 0: transformers' embedding lookup gives its row no
// gradient (nn.Embedding's padding_idx), and without the padding id ours differs there.
TEST(HfGemma2Parity, ThePaddingRowGetsNoGradientFromTheLookupAsInTransformers) {
  if (!hf_models(kScript).skip_reason.empty()) GTEST_SKIP() << hf_models(kScript).skip_reason;
  hyper_parallel::testing::HfParityCase c{"gemma2", edited_case("gqa", "pad_token_id", nullptr), at::kDouble, 1,
                                          false,    std::numeric_limits<double>::infinity(),     {}};
  const hyper_parallel::testing::HfDifferences d = hyper_parallel::testing::run_hf_parity_case(c);
  std::cout << "[ hf parity ] gemma2 gqa with pad_token_id = null: max |d logits| " << d.logits << ", max |d grad| "
            << d.grads << "\n";
  EXPECT_LE(d.logits, 1e-10);  // the forward does not depend on it
  EXPECT_GT(d.grads, 1e-4);
}

TEST(HfGemma2Config, FieldsAreReadWithGemma2ConfigsDefaultsAndWriteBackAsTheSameArgs) {
  const Gemma2Args a = Gemma2Args::from_hf_config_json(gemma2_config(
      R"(, "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "sliding_window": 4, "query_pre_attn_scalar": 24,
         "attn_logit_softcapping": null, "final_logit_softcapping": 15.0, "pad_token_id": 3,
         "layer_types": ["full_attention", "sliding_attention", "full_attention"], "hidden_act": "gelu_pytorch_tanh",
         "hidden_activation": "gelu_pytorch_tanh", "attention_bias": false, "use_bidirectional_attention": null,
         "rope_parameters": {"rope_type": "default", "rope_theta": 20000.0})"));
  EXPECT_EQ(a.dim, 16);
  EXPECT_EQ(a.n_kv_heads, 2);
  EXPECT_EQ(a.head_dim, 8);
  EXPECT_EQ(a.norm_eps, 1e-5);
  EXPECT_FALSE(a.tie_word_embeddings);
  EXPECT_EQ(a.sliding_window, 4);
  EXPECT_EQ(a.query_pre_attn_scalar, 24);
  EXPECT_EQ(a.attn_logit_softcapping, 0.0);  // null: off
  EXPECT_EQ(a.final_logit_softcapping, 15.0);
  EXPECT_EQ(a.pad_token_id, 3);
  EXPECT_EQ(a.rope_theta, 20000.0);
  EXPECT_EQ(a.attention_kind(0), Gemma2AttentionKind::full);
  EXPECT_EQ(a.attention_kind(1), Gemma2AttentionKind::sliding);
  EXPECT_EQ(a.attention_kind(2), Gemma2AttentionKind::full);

  // Absent fields take Gemma2Config's defaults (gemma-2-2b's), not Llama's.
  const Gemma2Args d = Gemma2Args::from_hf_config_json(R"({"model_type": "gemma2"})");
  EXPECT_EQ(d.dim, 2304);
  EXPECT_EQ(d.n_layers, 26);
  EXPECT_EQ(d.n_kv_heads, 4);
  EXPECT_EQ(d.head_dim, 256);
  EXPECT_EQ(d.vocab_size, 256000);
  EXPECT_EQ(d.query_pre_attn_scalar, 256);
  EXPECT_EQ(d.sliding_window, 4096);
  EXPECT_EQ(d.attn_logit_softcapping, 50.0);
  EXPECT_EQ(d.final_logit_softcapping, 30.0);
  EXPECT_EQ(d.pad_token_id, 0);
  EXPECT_TRUE(d.tie_word_embeddings);
  ASSERT_EQ(d.layer_types.size(), 26u);  // transformers' default: even layers sliding
  for (int64_t i = 0; i < 26; ++i) {
    EXPECT_EQ(d.attention_kind(i), i % 2 == 0 ? Gemma2AttentionKind::sliding : Gemma2AttentionKind::full) << i;
  }
  EXPECT_FALSE(Gemma2Args::from_hf_config_json(gemma2_config(R"(, "pad_token_id": null)")).pad_token_id);

  // to_hf_config_json reads back as the same args.
  for (const Gemma2Args& args : {a, d}) {
    const Gemma2Args back = Gemma2Args::from_hf_config_json(args.to_hf_config_json());
    EXPECT_EQ(back.dim, args.dim);
    EXPECT_EQ(back.n_layers, args.n_layers);
    EXPECT_EQ(back.n_heads, args.n_heads);
    EXPECT_EQ(back.n_kv_heads, args.n_kv_heads);
    EXPECT_EQ(back.head_dim, args.head_dim);
    EXPECT_EQ(back.vocab_size, args.vocab_size);
    EXPECT_EQ(back.ffn_hidden_dim, args.ffn_hidden_dim);
    EXPECT_EQ(back.max_seq_len, args.max_seq_len);
    EXPECT_EQ(back.norm_eps, args.norm_eps);
    EXPECT_EQ(back.rope_theta, args.rope_theta);
    EXPECT_EQ(back.query_pre_attn_scalar, args.query_pre_attn_scalar);
    EXPECT_EQ(back.attn_logit_softcapping, args.attn_logit_softcapping);
    EXPECT_EQ(back.final_logit_softcapping, args.final_logit_softcapping);
    EXPECT_EQ(back.sliding_window, args.sliding_window);
    EXPECT_EQ(back.layer_types, args.layer_types);
    EXPECT_EQ(back.pad_token_id, args.pad_token_id);
    EXPECT_EQ(back.tie_word_embeddings, args.tie_word_embeddings);
  }
}

TEST(HfGemma2Config, UnrepresentableFieldsAreRefusedNamingTheFieldAndItsValue) {
  auto refused = [](const std::string& extra) { return gemma2_config_error(gemma2_config(extra)); };
  EXPECT_THAT(refused(R"(, "attention_bias": true)"),
              HasSubstr("config.json: attention_bias = true: the model's projections have no bias"));
  EXPECT_THAT(refused(R"(, "hidden_activation": "gelu")"),
              HasSubstr("hidden_activation = \"gelu\": the model's MLP is GeGLU with gelu_pytorch_tanh"));
  EXPECT_THAT(refused(R"(, "use_bidirectional_attention": true)"),
              HasSubstr("use_bidirectional_attention = true: the model's attention is causal"));
  EXPECT_THAT(refused(R"(, "attention_dropout": 0.1)"), HasSubstr("attention_dropout = 0.1"));
  EXPECT_THAT(refused(R"(, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})"),
              HasSubstr("rope_parameters.rope_type = \"linear\": the only supported rope type is default"));
  EXPECT_THAT(refused(R"(, "rope_scaling": {"type": "dynamic", "factor": 2.0})"),
              HasSubstr("rope_scaling.type = \"dynamic\""));
  EXPECT_THAT(refused(R"(, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5})"),
              HasSubstr("rope_parameters.partial_rotary_factor = 0.5"));
  EXPECT_THAT(
      refused(R"(, "layer_types": ["full_attention", "chunked_attention", "full_attention"])"),
      HasSubstr("layer_types[1] = \"chunked_attention\": supported: \"full_attention\", \"sliding_attention\""));
  EXPECT_THAT(refused(R"(, "layer_types": ["full_attention"])"),
              HasSubstr("layer_types = [\"full_attention\"]: expected num_hidden_layers = 3 entries"));
  EXPECT_THAT(refused(R"(, "sliding_window": null)"),
              HasSubstr("sliding_window = null: transformers' Gemma 2 builds the sliding-window mask"));
  EXPECT_THAT(refused(R"(, "sliding_window": 0)"), HasSubstr("sliding_window = 0: must be > 0"));
  EXPECT_THAT(refused(R"(, "attn_logit_softcapping": 0.0)"),
              HasSubstr("attn_logit_softcapping = 0.0: must be > 0 (or null: no soft-capping)"));
  EXPECT_THAT(refused(R"(, "final_logit_softcapping": -30.0)"), HasSubstr("final_logit_softcapping = -30.0"));
  EXPECT_THAT(refused(R"(, "query_pre_attn_scalar": 24.5)"),
              HasSubstr("query_pre_attn_scalar = 24.5: expected an integer"));
  EXPECT_THAT(refused(R"(, "pad_token_id": 11)"), HasSubstr("pad_token_id = 11: must be in [0, vocab_size = 11)"));
  EXPECT_THAT(refused(R"(, "num_key_value_heads": 3)"),
              HasSubstr("num_key_value_heads = 3: must divide num_attention_heads = 4"));
  EXPECT_THAT(refused(R"(, "hidden_size": 18)"),
              HasSubstr("hidden_size = 18: must be a multiple of num_attention_heads = 4"));
  EXPECT_THAT(refused(R"(, "head_dim": 7)"), HasSubstr("head_dim = 7: must be even for RoPE"));
  EXPECT_THAT(refused(R"(, "model_type": "gemma")"),
              HasSubstr("model_type = \"gemma\": the gemma2 family reads model_type \"gemma2\""));
  EXPECT_THAT(gemma2_config_error("{not json"), HasSubstr("config.json: not valid JSON"));
  // A Gemma 2 config is no Llama config.
  try {
    LlamaArgs::from_hf_config_json(gemma2_config(""));
    ADD_FAILURE() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("model_type = \"gemma2\": the llama family reads model_type \"llama\""));
  }
}

TEST(HfGemma2Config, HeadsThatDoNotSplitOverTPAreAnErrorNamingBoth) {
  run_ranks(4, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {4});
    Gemma2 model(tiny_args());  // 4 query heads split, 2 kv heads do not
    try {
      parallelize_gemma2(model, mesh, true);
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("n_kv_heads 2 does not split over tensor_parallel_degree 4"));
    }
  });
}

TEST(HfGemma2Model, InitWeightsIsDeterministicIndependentOfTheGlobalRngAndScalesByOne) {
  auto initialised = [](uint64_t seed) {
    Gemma2 model(tiny_args());
    model->init_weights(seed);
    std::map<std::string, at::Tensor> out;
    for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach().clone();
    return out;
  };
  at::manual_seed(1);
  const auto a = initialised(7);
  at::manual_seed(2);
  const auto b = initialised(7);
  const auto other = initialised(8);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    EXPECT_TRUE(t.equal(b.at(name))) << name;
    if (name.find("norm") != std::string::npos) {
      EXPECT_EQ(t.abs().max().item<double>(), 0.0) << name << ": a scale of 1 + 0";
    } else {
      EXPECT_FALSE(t.equal(other.at(name))) << name;
    }
  }
  // The padding row starts at zero, as transformers initialises it; the tied head reads it.
  const at::Tensor embeddings = a.at("tok_embeddings.weight");
  EXPECT_EQ(embeddings[0].abs().max().item<double>(), 0.0);
  EXPECT_GT(embeddings[1].abs().max().item<double>(), 0.0);
  EXPECT_FALSE(a.count("output.weight"));
}

TEST(HfGemma2Model, BlockHooksAreCalledAroundEveryBlockInOrder) {
  struct Recorder : BlockHooks {
    std::vector<std::string> calls;
    void before_forward() override { calls.push_back("forward"); }
    void before_block(int64_t i) override { calls.push_back("before " + std::to_string(i)); }
    void after_block(int64_t i, const at::Tensor& out) override {
      calls.push_back("after " + std::to_string(i) + " " + c10::str(out.sizes()));
    }
  };
  Gemma2 model(tiny_args());
  model->init_weights(1);
  auto hooks = std::make_shared<Recorder>();
  model->set_block_hooks(hooks);
  const at::Tensor logits = model->forward(at::randint(11, {2, 5}, at::kLong));
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{2, 5, 11}));
  EXPECT_EQ(hooks->calls, (std::vector<std::string>{"forward", "before 0", "after 0 [2, 5, 16]", "before 1",
                                                    "after 1 [2, 5, 16]", "before 2", "after 2 [2, 5, 16]"}));
}

// FSDP gathers a block's parameters around the block through the hooks, grouped by the
// `layers.<i>.` names: two ranks sharding the model, each on its own sequence, reduce the
// gradient of the sum of their losses, as one unsharded model computes it.
TEST(HfGemma2Model, FullyShardedOverTwoRanksGivesTheGradientsOfTheUnshardedModel) {
  const Gemma2Args args = tiny_args();
  const at::Tensor tokens = at::randint(11, {2, 9}, at::TensorOptions().dtype(at::kLong));
  const at::Tensor targets = at::randint(11, {2, 9}, at::TensorOptions().dtype(at::kLong));
  auto loss_of = [&](Gemma2& model, int64_t row) {
    const at::Tensor logits = soft_cap(model->forward(tokens.narrow(0, row, 1)), args.final_logit_softcapping);
    return at::cross_entropy_loss(logits.flatten(0, 1), targets[row]);
  };
  Gemma2 whole(args);
  whole->to(at::kDouble);
  whole->init_weights(3);
  (loss_of(whole, 0) + loss_of(whole, 1)).backward();
  std::map<std::string, at::Tensor> expected;
  for (const auto& p : whole->named_parameters()) expected[p.key()] = p.value().grad();

  run_ranks(2, [&](int64_t rank) {
    Gemma2 model(args);
    model->to(at::kDouble);
    model->init_weights(3);
    std::vector<FullyShardedParameters::NamedParameters> groups(1 + args.n_layers);
    for (const auto& p : model->named_parameters()) {
      const std::string& name = p.key();
      const size_t group = name.rfind("layers.", 0) == 0 ? 1 + std::stoul(name.substr(7, name.find('.', 7) - 7)) : 0;
      groups.at(group).emplace_back(name, p.value());
    }
    auto fsdp = std::make_shared<FullyShardedParameters>(groups, init_device_mesh("cpu", {2}, {"dp_shard"}));
    model->set_block_hooks(fsdp);
    loss_of(model, rank).backward();
    fsdp->finish_backward();
    ASSERT_EQ(fsdp->names().size(), expected.size());
    for (size_t i = 0; i < fsdp->names().size(); ++i) {
      const at::Tensor grad = full_tensor(fsdp->shards()[i].grad());
      EXPECT_LE((grad - expected.at(fsdp->names()[i])).abs().max().item<double>(), 1e-12) << fsdp->names()[i];
    }
  });
}

TEST(ModelRegistry, Gemma2IsListedAndBuildsItsOwnModuleFromItsConfig) {
  EXPECT_EQ(model_family("gemma2").name, "gemma2");
  const std::string folder = hyper_parallel::testing::scratch_path("gemma2_registry");
  compat::create_directories(folder);
  std::ofstream(folder + "/config.json") << gemma2_config("");
  const ModelFamily& family = model_family("gemma2");
  auto module = family.from_hf_config(folder + "/config.json");
  const Gemma2 model = as_gemma2(*module);
  EXPECT_EQ(model->args().n_layers, 3);
  EXPECT_THROW(as_llama(*module), c10::Error);
  EXPECT_THROW(model_family("llama").from_hf_config(folder + "/config.json"), std::runtime_error);
  const auto params = model->named_parameters();
  EXPECT_TRUE(params.contains("layers.2.post_ffn_norm.weight"));
  EXPECT_FALSE(params.contains("output.weight"));  // tied by default, as Gemma2Config
  EXPECT_EQ(family.hf_adapter(*module).size(), params.size());
  EXPECT_EQ(Gemma2Args::from_hf_config_json(family.to_hf_config(*module)).layer_types, model->args().layer_types);
}

// transformers' own Gemma 2 models, loaded into ours at TP 1 and 2, exported, and loaded by
// transformers again (tests/hf/check_hf_export.py): the same weights and the same logits;
// TP 1 and TP 2 write the same bytes.
TEST(HfGemma2Export, TransformersLoadsTheExportWithTheSameLogitsAtTP1And2) {
  const auto& models = hf_models(kScript);
  if (!models.skip_reason.empty()) GTEST_SKIP() << models.skip_reason;
  nlohmann::json jobs = nlohmann::json::array();
  for (const std::string& name : kCases) {
    const std::string source = compat::join_path(models.dir, name);
    std::map<int64_t, std::string> folders;
    for (int64_t tp : {1, 2}) {
      for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        if (dtype == at::kBFloat16 && tp == 1) continue;
        const std::string out = hyper_parallel::testing::scratch_path("gemma2_export/" + name + "_tp" +
                                                                      std::to_string(tp) + "_" + c10::toString(dtype));
        HfExportOptions options;
        options.dtype = dtype;
        options.source_folder = source;
        run_ranks(tp, [&](int64_t) {
          const ModelFamily& family = model_family("gemma2");
          auto model = family.from_hf_config(source + "/config.json");
          if (tp > 1) family.parallelize(*model, init_device_mesh("cpu", {tp}, {"tp"}), true, false);
          load_hf_checkpoint(*model, family.hf_adapter(*model), source);
          export_hf_checkpoint(*model, family, out, options);
        });
        if (dtype == at::kFloat) folders[tp] = out;
        jobs.push_back({{"source", source}, {"export", out}, {"dtype", dtype == at::kFloat ? "float32" : "bfloat16"}});
      }
    }
    for (const auto& f : compat::list_directory(folders[1])) {
      EXPECT_TRUE(file_bytes(compat::join_path(folders[2], f)) == file_bytes(compat::join_path(folders[1], f)))
          << name << ": " << f << " at TP 2 vs TP 1";
    }
  }
  const std::string jobs_file = hyper_parallel::testing::scratch_path("gemma2_export/jobs.json");
  std::ofstream(jobs_file) << jobs.dump();
  const auto r = hyper_parallel::testing::run_command("'" + hyper_parallel::testing::python_path() + "' '" +
                                                      hyper_parallel::testing::source_dir() +
                                                      "/tests/hf/check_hf_export.py' '" + jobs_file + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  size_t checked = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string what = j.at("export").get<std::string>();
    EXPECT_TRUE(j.at("weights_equal").get<bool>()) << what;
    EXPECT_TRUE(j.at("loading_info").empty()) << what << ": " << j.at("loading_info").dump();
    EXPECT_EQ(j.at("tie").get<bool>(), what.find("/gqa_") == std::string::npos) << what;  // gqa alone is untied
    EXPECT_LE(j.at("d_logits").get<double>(), 1e-6) << what;
    if (j.at("dtype") == "bfloat16") {
      EXPECT_LE(j.at("d_logits_fp32").get<double>(), 2e-2 * j.at("max_logit").get<double>()) << what;
    }
    std::cout << "[ hf export ] " << line << "\n";
    ++checked;
  }
  EXPECT_EQ(checked, jobs.size()) << r.output;
}

// hp-train's loss takes the model's own final soft-capping (Gemma 2's 30 by default) with
// [training]'s z-loss; a training.logit_softcap that differs from it is refused, never one
// silently preferred. A model without a cap takes training.logit_softcap, and a module that
// is no language model is named.
TEST(Gemma2TrainSpec, TheModelsFinalSoftCapIsTheLossesAndAnotherTrainingSoftCapIsRefused) {
  const Gemma2 gemma(tiny_args());
  const double cap = gemma->args().final_logit_softcapping;
  ASSERT_EQ(cap, 30.0);
  const train::TrainSpec& spec = train::train_spec("gemma2");
  train::TrainingConfig t;
  t.loss_terms.z_loss_weight = 1e-4;
  train::LossTerms terms = spec.loss_terms(*gemma, t);
  EXPECT_EQ(terms.logit_softcap, cap);
  EXPECT_EQ(terms.z_loss_weight, 1e-4);
  t.loss_terms.logit_softcap = cap;  // the same cap said twice is fine
  EXPECT_EQ(spec.loss_terms(*gemma, t).logit_softcap, cap);
  t.loss_terms.logit_softcap = 50.0;
  EXPECT_THAT([&] { spec.loss_terms(*gemma, t); },
              ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr(
                  "training.logit_softcap = 50 but the model soft-caps its logits at 30 (final_logit_softcapping)")));

  LlamaArgs small;
  small.dim = 16;
  small.n_heads = 2;
  small.vocab_size = 11;
  const Llama llama(small);
  EXPECT_EQ(train::train_spec("llama").loss_terms(*llama, t).logit_softcap, 50.0);

  torch::nn::Linear linear(2, 2);
  EXPECT_THAT([&] { as_causal_lm(*linear); }, ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr(
                                                  "expected a causal language model module, got a")));
}

}  // namespace hf_gemma2_test
