// FLOPs per token (each family's count, TorchTitan's formula) and MFU: the count for known
// sizes against the formula worked out by hand, the peak given or measured, and the
// metrics.jsonl lines and start-up line of a training run.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>

#include "harness/rank_harness.h"
#include "harness/scratch_folder.h"
#include "hyper_parallel/models/gemma2.h"
#include "hyper_parallel/models/llama.h"
#include "hyper_parallel/models/qwen3.h"
#include "hyper_parallel_train/config/job_config.h"
#include "train/metrics/metrics.h"
#include "train/metrics/mfu.h"
#include "hyper_parallel_train/spec/train_spec.h"
#include "hyper_parallel_train/trainer.h"

namespace model_flops_test {

using namespace hyper_parallel;
using namespace hyper_parallel::train;
using ::testing::HasSubstr;

// TorchTitan: 6 x (parameters - token embedding, unless tied) + 12 x layers x heads x
// head_dim x seq_len.
int64_t torchtitan_flops(int64_t matmul_parameters, int64_t layers, int64_t heads, int64_t head_dim, int64_t seq) {
  return 6 * matmul_parameters + 12 * layers * heads * head_dim * seq;
}

// The debug job's Llama: dim 128, 2 layers, 4 heads (head_dim 32), MLP 384, vocab 32000.
TEST(ModelFlops, LlamaCountsEveryMatmulParameterButTheEmbeddingTable) {
  DecoderSizes sizes;
  sizes.dim = 128;
  sizes.n_layers = 2;
  sizes.n_heads = 4;
  sizes.vocab_size = 32000;
  Llama model(LlamaArgs::from_sizes(sizes));
  ASSERT_EQ(model->args().hidden_dim(), 384);
  const int64_t per_layer = 4 * 128 * 128 + 3 * 128 * 384 + 2 * 128;  // q k v o, w1 w2 w3, two norms
  const int64_t matmul = 2 * per_layer + 128 + 32000 * 128;           // + final norm + head
  EXPECT_EQ(model->flops_per_token(64), torchtitan_flops(matmul, 2, 4, 32, 64));
  EXPECT_EQ(model->flops_per_token(64), 27332352);  // the same, as a number for the docs
  // The train spec hands the family's count to the Trainer.
  EXPECT_EQ(train_spec("llama").flops_per_token(*model, 64), model->flops_per_token(64));
}

// A tied head reads the embedding table: counted, once (TorchTitan's enable_weight_tying).
// Grouped key/values, an explicit head_dim and Qwen3's q/k norms change the count as written.
TEST(ModelFlops, TiedEmbeddingsCountOnceAndGqaHeadsAsTheyAre) {
  LlamaArgs a;
  a.dim = 64;
  a.n_layers = 3;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.head_dim = 24;
  a.vocab_size = 100;
  a.ffn_hidden_dim = 96;
  a.tie_word_embeddings = true;
  Qwen3 model = qwen3_model(a);  // Llama's blocks with q/k norms
  const int64_t q = 4 * 24, kv = 2 * 24;
  const int64_t per_layer = 64 * q + 2 * 64 * kv + q * 64 + 3 * 64 * 96 + 2 * 64 + 2 * 24;
  const int64_t matmul = 3 * per_layer + 64 + 100 * 64;  // the table once, as the head
  EXPECT_EQ(model->flops_per_token(32), torchtitan_flops(matmul, 3, 4, 24, 32));
}

// Gemma 2: four norms a layer, a tied head, and its sliding-window layers counted at the
// full sequence length (as TorchTitan counts gpt-oss's).
TEST(ModelFlops, Gemma2CountsItsSlidingLayersAtTheFullSequence) {
  Gemma2Args a;
  a.dim = 64;
  a.n_layers = 2;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.head_dim = 16;
  a.vocab_size = 128;
  a.ffn_hidden_dim = 96;
  a.max_seq_len = 64;
  a.query_pre_attn_scalar = 16;
  a.sliding_window = 8;
  Gemma2 model(a);
  ASSERT_EQ(model->args().attention_kind(0), Gemma2AttentionKind::sliding);
  const int64_t per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 96 + 4 * 64;
  const int64_t matmul = 2 * per_layer + 64 + 128 * 64;
  EXPECT_EQ(model->flops_per_token(32), torchtitan_flops(matmul, 2, 4, 16, 32));
}

TEST(Mfu, TflopsPerRankAndMfuFromTheJobsTokensPerSecond) {
  const ModelFlopsUtilization mfu(2'000'000'000, 4, PeakFlops{0.5, "given (metrics.peak_tflops)"});
  // 1000 tokens/s over 4 ranks: 250 each, 2e9 FLOPs apiece: 0.5 TFLOPs, all of the peak.
  EXPECT_DOUBLE_EQ(mfu.tflops_per_rank(1000), 0.5);
  EXPECT_DOUBLE_EQ(mfu.mfu_pct(1000), 100.0);
  EXPECT_DOUBLE_EQ(mfu.mfu_pct(100), 10.0);
  EXPECT_THROW(ModelFlopsUtilization(1, 1, PeakFlops{0, "none"}), std::invalid_argument);
}

TEST(Mfu, AGivenPeakIsUsedAndNamedAsGiven) {
  const PeakFlops peak = peak_flops(312.0, at::kBFloat16, at::Device(at::kCPU));
  EXPECT_EQ(peak.tflops, 312.0);
  EXPECT_EQ(peak.source, "given (metrics.peak_tflops)");
}

TEST(Mfu, AMeasuredPeakNamesItsMatmul) {
  const PeakFlops peak = peak_flops(0.0, at::kFloat, at::Device(at::kCPU));
  EXPECT_GT(peak.tflops, 0.0);
  EXPECT_TRUE(std::regex_match(peak.source, std::regex(R"(measured \(\d+\^3 float32 matmul on cpu, best of 3\))")))
      << peak.source;
  // Once per process: the same figure again.
  EXPECT_EQ(measure_matmul_peak(at::kFloat, at::Device(at::kCPU)).tflops, peak.tflops);
}

// TP 2 on rank threads with a given peak: every logged line carries tflops (the model's
// FLOPs per token x tokens per second / 2 ranks) and mfu_pct against that peak, and the
// start-up line names the count and the peak's source.
TEST(Mfu, MetricsLinesCarryTflopsAndMfuAgainstTheGivenPeak) {
  JobConfig c;
  c.dump_folder = hyper_parallel::testing::scratch_path("mfu_metrics");
  c.model.dim = 32;
  c.model.n_layers = 1;
  c.model.n_heads = 4;
  c.model.vocab_size = 64;
  c.model.multiple_of = 16;
  c.model.max_seq_len = 16;
  c.training.batch_size = 2;
  c.training.seq_len = 16;
  c.training.steps = 3;
  c.parallelism.tensor_parallel_degree = 2;
  c.validation.enable = false;
  c.checkpoint.enable = false;
  c.metrics.enable_plot = false;
  c.metrics.peak_tflops = 0.25;
  std::ostringstream log;
  int64_t flops_per_token = 0;
  hyper_parallel::testing::run_ranks(2, [&](int64_t rank) {
    Trainer trainer(c, rank == 0 ? &log : nullptr);
    if (rank == 0) flops_per_token = trainer.spec().flops_per_token(trainer.model(), 16);
    trainer.train();
  });
  EXPECT_THAT(log.str(), HasSubstr("per token (seq_len 16, TorchTitan's count); peak 0.25 TFLOPs per rank given "
                                   "(metrics.peak_tflops)"));
  EXPECT_THAT(log.str(), HasSubstr(" TFLOPs | MFU "));
  const auto records = read_metrics(c.dump_folder + "/metrics/metrics.jsonl");
  ASSERT_EQ(records.size(), 3u);
  ASSERT_GT(flops_per_token, 0);
  for (const auto& r : records) {
    const double tokens_per_s = r.at("tokens_per_s").get<double>();
    const double tflops = r.at("tflops").get<double>();
    EXPECT_DOUBLE_EQ(tflops, static_cast<double>(flops_per_token) * tokens_per_s / 2 / 1e12);
    EXPECT_DOUBLE_EQ(r.at("mfu_pct").get<double>(), 100.0 * tflops / 0.25);
  }
}

}  // namespace model_flops_test
