// Reading Hugging Face checkpoints: the safetensors format's rules, the loader's errors
// (the same on every rank), the Llama config fields honoured or refused, the RoPE row
// permutation, and the model registry.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <map>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>

#include "compat/file_system.h"
#include "harness/rank_harness.h"
#include "harness/scratch_folder.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/models/llama.h"
#include "hyper_parallel/nn/parameters_on_meta.h"
#include "hyper_parallel/models/model_registry.h"
#include "hyper_parallel/models/qwen3.h"
#include "models/safetensors.h"
#include "models/safetensors_writer.h"
#include "hyper_parallel_train/config/job_config.h"

namespace hf_checkpoint_test {

using namespace hyper_parallel;
using hyper_parallel::testing::run_ranks;
using ::testing::HasSubstr;

namespace {

std::string scratch(const std::string& name) { return hyper_parallel::testing::scratch_path("hf_checkpoint/" + name); }

std::string bytes_with_header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(json.size()) >> (8 * i));
  return out + json + data;
}

std::string parse_error(const std::string& bytes) {
  try {
    hf::parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), bytes.size(),
                                 "f.safetensors");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

LlamaArgs tiny_hf_args(bool tied = false) {
  LlamaArgs a;
  a.dim = 16;
  a.n_layers = 1;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.head_dim = 8;
  a.vocab_size = 11;
  a.ffn_hidden_dim = 24;
  a.max_seq_len = 8;
  a.tie_word_embeddings = tied;
  a.rope_tables_like_hf = true;
  return a;
}

// A checkpoint folder with the model's own parameters under Hugging Face names.
std::map<std::string, at::Tensor> save_as_hf(Llama& model, const std::string& folder, at::ScalarType dtype) {
  std::map<std::string, at::Tensor> ours;
  for (const auto& p : model->named_parameters()) ours[p.key()] = p.value().detach().to(dtype);
  auto hf_named = to_hf_names(ours, llama_hf_adapter(model->args()), /*sum_shared=*/false);
  compat::create_directories(folder);
  hf::write_safetensors(folder + "/model.safetensors", hf_named);
  return hf_named;
}

std::string config_error(const std::string& json) {
  try {
    LlamaArgs::from_hf_config_json(json);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

const char* kConfig = R"({"model_type": "llama", "hidden_size": 16, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11, "intermediate_size": 24 %s})";

std::string config_with(const std::string& extra) {
  char buf[1024];
  std::snprintf(buf, sizeof buf, kConfig, extra.c_str());
  return buf;
}

}  // namespace

TEST(Safetensors, WrittenFileReadsBackWithMetadataAndUnalignedData) {
  const std::string path = scratch("round.safetensors");
  at::Tensor a = at::arange(6, at::kFloat).view({2, 3}), b = at::arange(3, at::kBFloat16);
  hf::write_safetensors(path, {{"a", a}, {"b", b}}, {{"format", "pt"}});
  hf::SafetensorsFile f(path);
  EXPECT_EQ(f.header().metadata.at("format"), "pt");
  EXPECT_EQ(f.entry("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.entry("b").dtype, at::kBFloat16);
  EXPECT_THAT(parse_error(bytes_with_header(R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})", "abc")), "");
  EXPECT_THROW(f.entry("c"), std::runtime_error);
}

TEST(Safetensors, MalformedHeadersAreErrorsNamingFileAndTensor) {
  EXPECT_THAT(parse_error("abc"), HasSubstr("shorter than the 8-byte header length"));
  EXPECT_THAT(parse_error(bytes_with_header("{}", "").substr(0, 9)), HasSubstr("truncated"));
  EXPECT_THAT(parse_error(bytes_with_header("[1]", "")), HasSubstr("not a JSON object"));
  EXPECT_THAT(parse_error(bytes_with_header("{", "")), HasSubstr("not valid JSON"));
  EXPECT_THAT(parse_error(bytes_with_header(R"({"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", "a")),
              HasSubstr("tensor 'w': unknown or unsupported dtype \"F8_E4M3\""));
  EXPECT_THAT(parse_error(bytes_with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "abcd")),
              HasSubstr("f.safetensors: tensor 'w': data_offsets [0,8] run past the end of the file"));
  EXPECT_THAT(parse_error(bytes_with_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "abcdefgh")),
              HasSubstr("[3] F32 needs 12 bytes, data_offsets [0,8] hold 8"));
  EXPECT_THAT(
      parse_error(bytes_with_header(
          R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"v":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
          "abc")),
      HasSubstr("overlap"));
  EXPECT_THAT(parse_error(bytes_with_header(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", "abc")),
              HasSubstr("hole"));
  EXPECT_THAT(parse_error(bytes_with_header(R"({"w":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", "ab")),
              HasSubstr("not a non-negative integer"));
  EXPECT_THAT(parse_error(bytes_with_header(
                  R"({"w":{"dtype":"F64","shape":[4294967296,536870912],"data_offsets":[0,0]}})", "")),
              HasSubstr("needs more than 2^64"));
  EXPECT_THAT(parse_error(bytes_with_header(R"({"__metadata__":{"a":1}})", "")), HasSubstr("__metadata__.a"));
  EXPECT_THAT(parse_error(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8)), HasSubstr("exceeds the format's limit"));
}

TEST(HfCheckpoint, RopeRowPermutationRoundTripsAndMatchesRotateHalf) {
  at::Tensor w = at::randn({2 * 8, 5}, at::kDouble);
  EXPECT_TRUE(at::equal(rope_rows_to_hf(rope_rows_from_hf(w, 8), 8), w));
  // Rotate-half pairs rows (i, i + 4) of a head; ours puts them at (2i, 2i + 1).
  at::Tensor ours = rope_rows_from_hf(w, 8);
  EXPECT_TRUE(at::equal(ours[2 * 1], w[1]));
  EXPECT_TRUE(at::equal(ours[2 * 1 + 1], w[1 + 4]));
  EXPECT_TRUE(at::equal(ours[8 + 2 * 3 + 1], w[8 + 3 + 4]));
}

TEST(HfCheckpoint, LoadedShardsEqualTheFullModelAtTP2InEveryDtype) {
  Llama full(tiny_hf_args(/*tied=*/true));
  full->init_weights(5);
  for (at::ScalarType stored : {at::kFloat, at::kBFloat16, at::kDouble}) {
    const std::string folder = scratch(std::string("full_") + c10::toString(stored));
    save_as_hf(full, folder, stored);
    run_ranks(2, [&](int64_t) {
      auto mesh = init_device_mesh("cpu", {2}, {"tp"});
      Llama model(tiny_hf_args(true));
      model->to(at::kDouble);
      parallelize_llama(model, mesh, true);
      load_hf_checkpoint(*model, llama_hf_adapter(model->args()), folder);
      for (const auto& p : model->named_parameters()) {
        at::Tensor want = full->named_parameters()[p.key()].detach().to(stored).to(at::kDouble);
        const at::Tensor got = is_dtensor(p.value()) ? full_tensor(p.value()) : p.value();
        EXPECT_TRUE(at::equal(got, want)) << p.key() << " stored as " << stored;
      }
    });
  }
}

// Built under ParametersOnMeta, the model holds no weights until it is sharded and
// materialized: every parameter is on the meta device (a DTensor's local piece too, after
// parallelize), a tied head is still the embedding's tensor, init_weights refuses, and the
// load gives exactly the weights of a model built in full (TP 2; at TP 1, where nothing is
// sharded, materializing plain meta parameters is a clear error).
TEST(HfCheckpoint, AModelBuiltOnMetaIsShardedMaterializedAndLoadedAsOneBuiltInFull) {
  for (bool tied : {false, true}) {
    Llama full(tiny_hf_args(tied));
    full->init_weights(9);
    const std::string folder = scratch(std::string("meta_") + (tied ? "tied" : "untied"));
    save_as_hf(full, folder, at::kFloat);
    for (int64_t tp : {1, 2}) {
      run_ranks(tp, [&](int64_t) {
        Llama model{nullptr};
        {
          ParametersOnMeta on_meta;
          model = Llama(tiny_hf_args(tied));
        }
        EXPECT_FALSE(parameters_on_meta()) << "the scope ended";
        for (const auto& p : model->named_parameters()) {
          EXPECT_EQ(p.value().is_meta(), p.key().find("norm") == std::string::npos)
              << p.key() << ": linear and embedding weights on meta, norms real";
        }
        for (const auto& b : model->buffers()) EXPECT_FALSE(b.is_meta()) << "RoPE tables are computed";
        EXPECT_THAT([&] { model->init_weights(1); }, ::testing::ThrowsMessage<c10::Error>(HasSubstr("meta device")));
        if (tp == 1) {
          EXPECT_THAT([&] { materialize_parameters(*model, at::kCPU); },
                      ::testing::ThrowsMessage<c10::Error>(HasSubstr("is a plain tensor on the meta device")));
          return;
        }
        auto mesh = init_device_mesh("cpu", {tp}, {"tp"});
        parallelize_llama(model, mesh, true);  // src_data_rank 0: nothing to scatter from meta
        for (const auto& p : model->named_parameters()) {
          if (p.key().find("norm") != std::string::npos) continue;
          ASSERT_TRUE(is_dtensor(p.value())) << p.key();
          EXPECT_TRUE(to_local(p.value()).is_meta()) << p.key() << ": sharded as shapes only";
        }
        materialize_parameters(*model, at::kCPU);
        for (const auto& p : model->named_parameters()) {
          EXPECT_FALSE((is_dtensor(p.value()) ? to_local(p.value()) : p.value()).is_meta()) << p.key();
          EXPECT_TRUE(p.value().requires_grad()) << p.key();
        }
        if (tied) EXPECT_TRUE(model->output->weight.is_same(model->tok_embeddings->weight));
        load_hf_checkpoint(*model, llama_hf_adapter(model->args()), folder);
        for (const auto& p : model->named_parameters()) {
          const at::Tensor got = is_dtensor(p.value()) ? full_tensor(p.value()) : p.value();
          EXPECT_TRUE(at::equal(got, full->named_parameters()[p.key()].detach())) << p.key() << " tp " << tp;
        }
        at::Tensor tokens = at::arange(8, at::kLong).remainder(11).view({1, 8});
        at::NoGradGuard no_grad;
        const at::Tensor logits = model->forward(tokens);
        EXPECT_TRUE(at::allclose(is_dtensor(logits) ? full_tensor(logits) : logits, full->forward(tokens), 1e-5, 1e-6));
      });
    }
  }
}

// A tied model holds ONE parameter for the embeddings and the head: named_parameters (what
// the optimizer, clipping, master weights and checkpoints walk) lists it once, the head
// reads it across dtype moves and TP sharding, and its gradient is the sum of both uses:
// the embeddings' plus the head's gradient of the same weights held as two parameters.
TEST(HfCheckpoint, TiedHeadIsTheEmbeddingParameterAndItsGradientSumsBothUsesAtTP1AndTP2) {
  Llama untied(tiny_hf_args(/*tied=*/false));
  untied->init_weights(3);
  untied->to(at::kDouble);
  {
    at::NoGradGuard no_grad;
    untied->output->weight.copy_(untied->tok_embeddings->weight);
  }
  const at::Tensor tokens = at::randint(11, {2, 6}, at::make_generator<at::CPUGeneratorImpl>(1));
  const at::Tensor targets = at::randint(11, {12}, at::make_generator<at::CPUGeneratorImpl>(2));
  at::Tensor ref_loss = torch::nn::functional::cross_entropy(untied->forward(tokens).flatten(0, 1), targets);
  ref_loss.backward();
  const at::Tensor want = untied->tok_embeddings->weight.grad() + untied->output->weight.grad();
  EXPECT_GT((untied->output->weight.grad()).abs().max().item<double>(), 0.0);

  for (int64_t tp : {1, 2}) {
    run_ranks(tp, [&](int64_t) {
      Llama tied(tiny_hf_args(/*tied=*/true));
      EXPECT_FALSE(tied->named_parameters().contains("output.weight"));
      EXPECT_EQ(tied->named_parameters().size() + 1, untied->named_parameters().size());
      tied->to(at::kDouble);  // set_data in place: the head still reads the same tensor
      EXPECT_TRUE(tied->output->weight.is_same(tied->tok_embeddings->weight));
      EXPECT_EQ(tied->output->weight.scalar_type(), at::kDouble);
      {
        at::NoGradGuard no_grad;
        for (const auto& p : tied->named_parameters()) p.value().copy_(untied->named_parameters()[p.key()]);
      }
      std::optional<LossParallelGuard> guard;
      if (tp > 1) {
        parallelize_llama(tied, init_device_mesh("cpu", {tp}, {"tp"}), /*loss_parallel=*/true);
        EXPECT_TRUE(tied->output->weight.is_same(tied->tok_embeddings->weight));
        EXPECT_TRUE(placements_of(tied->tok_embeddings->weight) == Placements{Placement::shard(0)});
        guard.emplace();
      }
      at::Tensor loss = torch::nn::functional::cross_entropy(tied->forward(tokens).flatten(0, 1), targets);
      loss.backward();
      auto full = [](const at::Tensor& t) { return (is_dtensor(t) ? full_tensor(t) : t).detach(); };
      EXPECT_NEAR(full(loss).item<double>(), ref_loss.item<double>(), 1e-13) << "tp " << tp;
      EXPECT_LE((full(tied->tok_embeddings->weight.grad()) - want).abs().max().item<double>(), 1e-13) << "tp " << tp;
    });
  }
}

TEST(HfCheckpoint, MissingUnexpectedAndMisshapenTensorsAreTheSameErrorOnEveryRank) {
  Llama full(tiny_hf_args());
  full->init_weights(5);
  const std::string folder = scratch("broken");
  auto tensors = save_as_hf(full, folder + "_ok", at::kFloat);
  tensors.erase("model.norm.weight");
  tensors["model.layers.0.mlp.up_proj.weight"] = at::zeros({25, 16});
  tensors["model.extra.weight"] = at::zeros({2});
  tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = at::zeros({4});  // derived: ignored
  compat::create_directories(folder);
  hf::write_safetensors(folder + "/model.safetensors", tensors);
  std::vector<std::string> messages(2);
  run_ranks(2, [&](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    Llama model(tiny_hf_args());
    parallelize_llama(model, mesh, true);
    try {
      load_hf_checkpoint(*model, llama_hf_adapter(model->args()), folder);
      ADD_FAILURE() << "expected an error";
    } catch (const std::runtime_error& e) {
      messages[rank] = e.what();
    }
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_THAT(messages[0], HasSubstr("missing tensor 'model.norm.weight' (for norm.weight [16])"));
  EXPECT_THAT(messages[0],
              HasSubstr("model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight' has shape [25, 16], "
                        "the model expects [24, 16] for layers.0.feed_forward.w3.weight"));
  EXPECT_THAT(messages[0], HasSubstr("model.safetensors: unexpected tensor 'model.extra.weight' [2]"));
  EXPECT_THAT(messages[0], ::testing::Not(HasSubstr("inv_freq")));
}

TEST(HfCheckpoint, ShardedIndexNamingAMissingFileOrTensorIsAnError) {
  const std::string folder = scratch("index");
  compat::create_directories(folder);
  hf::write_safetensors(folder + "/a.safetensors", {{"x", at::zeros({2})}});
  std::ofstream(folder + "/model.safetensors.index.json")
      << R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})";
  Llama model(tiny_hf_args());
  try {
    load_hf_checkpoint(*model, llama_hf_adapter(model->args()), folder);
    ADD_FAILURE() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("b.safetensors: cannot open"));
  }
  std::ofstream(folder + "/model.safetensors.index.json") << R"({"weight_map": {"y": "a.safetensors"}})";
  try {
    load_hf_checkpoint(*model, llama_hf_adapter(model->args()), folder);
    ADD_FAILURE() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("a.safetensors: has no tensor 'y'"));
  }
  EXPECT_THROW(load_hf_checkpoint(*model, llama_hf_adapter(model->args()), scratch("nothing_here")),
               std::runtime_error);
}

TEST(HfLlamaConfig, FieldsAreReadAndUnrepresentableOnesRefusedByName) {
  const LlamaArgs a = LlamaArgs::from_hf_config_json(config_with(
      R"(, "head_dim": 8, "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "max_position_embeddings": 32,
          "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16})"));
  EXPECT_EQ(a.resolved_kv_heads(), 2);
  EXPECT_EQ(a.resolved_head_dim(), 8);
  EXPECT_EQ(a.hidden_dim(), 24);
  EXPECT_EQ(a.norm_eps, 1e-6);
  EXPECT_EQ(a.rope_theta, 500000.0);
  EXPECT_TRUE(a.tie_word_embeddings);
  ASSERT_TRUE(a.rope_scaling.has_value());
  EXPECT_EQ(a.rope_scaling->original_max_position_embeddings, 16);
  // Older files: a top-level rope_theta, rope_scaling with "type".
  EXPECT_EQ(LlamaArgs::from_hf_config_json(config_with(R"(, "rope_theta": 1234.0, "rope_scaling": null)")).rope_theta,
            1234.0);
  EXPECT_EQ(LlamaArgs::from_hf_config_json(config_with("")).norm_eps, 1e-6);  // transformers' default

  EXPECT_THAT(config_error(config_with(R"(, "attention_bias": true)")), HasSubstr("attention_bias = true"));
  EXPECT_THAT(config_error(config_with(R"(, "mlp_bias": true)")), HasSubstr("mlp_bias = true"));
  EXPECT_THAT(config_error(config_with(R"(, "hidden_act": "gelu")")), HasSubstr("hidden_act = \"gelu\""));
  EXPECT_THAT(config_error(config_with(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 4.0})")),
              HasSubstr("rope_parameters.rope_type = \"yarn\": supported rope types: default, llama3"));
  EXPECT_THAT(config_error(config_with(R"(, "rope_scaling": {"type": "linear", "factor": 2.0})")),
              HasSubstr("rope_scaling.type = \"linear\""));
  EXPECT_THAT(config_error(config_with(R"(, "model_type": "qwen2")")), HasSubstr("model_type = \"qwen2\""));
  EXPECT_THAT(config_error(R"({"hidden_size": 16})"), HasSubstr("num_hidden_layers is missing"));
  EXPECT_THAT(config_error(config_with(R"(, "intermediate_size": 2.5)")),
              HasSubstr("intermediate_size = 2.5: expected an integer"));
}

TEST(HfLlamaConfig, RopeTablesAreTransformersFloat32OnesAndLlama3ScalingChangesThem) {
  LlamaArgs a = tiny_hf_args();
  a.max_seq_len = 4096;
  const auto [cos_hf, sin_hf] = llama_rope_tables(a);
  a.rope_tables_like_hf = false;
  const auto [cos_ours, sin_ours] = llama_rope_tables(a);
  // The float64 tables rounded once differ from transformers' float32 ones at long positions.
  EXPECT_GT((cos_hf - cos_ours).abs().max().item<double>(), 1e-5);
  a.rope_tables_like_hf = true;
  a.rope_scaling = Llama3RopeScaling{8.0, 1.0, 4.0, 16};
  const auto [cos_scaled, sin_scaled] = llama_rope_tables(a);
  EXPECT_GT((cos_scaled - cos_hf).abs().max().item<double>(), 1e-2);
}

TEST(HfLlamaConfig, KvHeadsThatDoNotSplitOverTPAreAnErrorNamingBoth) {
  run_ranks(4, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {4});
    Llama model(tiny_hf_args());  // 4 query heads split, 2 kv heads do not
    try {
      parallelize_llama(model, mesh, true);
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("n_kv_heads 2 does not split over tensor_parallel_degree 4"));
    }
  });
}

// A config.json's text builds every family's module as the file does (a checkpoint's
// recorded config is rebuilt with no scratch file); a bad field names the source given.
TEST(ModelRegistry, EveryFamilyBuildsFromConfigJsonTextAsFromTheFile) {
  const std::map<std::string, std::string> configs = {
      {"llama", tiny_hf_args().to_hf_config_json()},
      {"qwen3", qwen3_hf_config_json(tiny_hf_args())},
      {"gemma2", R"({"model_type": "gemma2"})"},  // transformers' defaults (on the meta device)
  };
  ASSERT_EQ(configs.size(), model_family_names().size());
  const std::string folder = hyper_parallel::testing::scratch_path("registry_from_json");
  compat::create_directories(folder);
  ParametersOnMeta on_meta;
  for (const auto& [name, text] : configs) {
    const ModelFamily& family = model_family(name);
    std::ofstream(folder + "/config.json") << text;
    const auto from_file = family.from_hf_config(folder + "/config.json");
    const auto from_text = family.from_hf_config_json(text, "the recorded config.json");
    EXPECT_EQ(family.to_hf_config(*from_text), family.to_hf_config(*from_file)) << name;
    const auto a = from_file->named_parameters(), b = from_text->named_parameters();
    ASSERT_EQ(a.size(), b.size()) << name;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(b[i].key(), a[i].key()) << name;
      EXPECT_EQ(b[i].value().sizes(), a[i].value().sizes()) << name << " " << a[i].key();
    }
    try {
      family.from_hf_config_json(R"({"model_type": ")" + name + R"(", "hidden_size": "wide"})",
                                 "the recorded config.json");
      ADD_FAILURE() << name << ": expected an error";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("the recorded config.json: hidden_size")) << name;
    }
  }
}

TEST(ModelRegistry, UnknownFamilyIsAnErrorListingTheKnownOnes) {
  EXPECT_EQ(model_family("llama").name, "llama");
  try {
    model_family("qwen2");
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown model family 'qwen2'; known: llama, qwen3, gemma2");
  }
  train::JobConfig cfg;
  cfg.model.name = "qwen2";
  try {
    train::validate(cfg);
    ADD_FAILURE() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("model.name = \"qwen2\": unknown model family 'qwen2'; known: llama, qwen3, gemma2"));
  }
}

}  // namespace hf_checkpoint_test
