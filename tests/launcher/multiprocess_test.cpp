// Real processes through hp-run: the same library code over TCPStore + Gloo.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "compat/file_system.h"
#include "harness/rank_harness.h"

namespace multiprocess_test {

using hyper_parallel::testing::binary_path;
using hyper_parallel::testing::run_command;
namespace compat = hyper_parallel::compat;

namespace {
int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}
// A TCP port nobody listens on right now (the kernel's pick for port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ADD_FAILURE() << "cannot pick a free port";
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The per-step losses hp-train logged in <dump>/metrics/metrics.jsonl.
std::vector<double> logged_losses(const std::string& dump) {
  std::ifstream in(dump + "/metrics/metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}
}  // namespace

TEST(MultiProcess, ExamplePassesOnTwoAndFourRanks) {
  for (int n : {2, 4}) {
    auto r =
        run_command(binary_path("hp-run") + " --nproc-per-node " + std::to_string(n) + " " + binary_path("hp-example"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(count(r.output, "all checks passed"), n) << r.output;
    EXPECT_EQ(count(r.output, "MISMATCH"), 0) << r.output;
    EXPECT_NE(r.output.find("[rank" + std::to_string(n - 1) + "]:"), std::string::npos) << r.output;
  }
}

TEST(MultiProcess, AFailingRankStopsTheOthersWithinSeconds) {
  // Rank 1 exits 3 while the others wait for it in a collective.
  auto r = run_command("HP_COLLECTIVE_TIMEOUT_S=120 " + binary_path("hp-run") + " --nproc-per-node 4 " +
                       binary_path("hp-example") + " --fail-rank 1 --exit-code 3");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(r.seconds, 20.0) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("status 3"), std::string::npos) << r.output;
}

// Rank 1 throws and tears down slowly (closes its process group, then waits a second):
// the other ranks die of the disconnect and exit first, and hp-run stops rank 1 while it
// waits. hp-run still names rank 1 and its message, from the ranks' error files. (Were
// rank 1 to exit first after all, its status 5 would be hp-run's.)
TEST(MultiProcess, ARankThatThrowsIsNamedEvenWhenItsPeersExitFirst) {
  auto r = run_command("HP_COLLECTIVE_TIMEOUT_S=120 " + binary_path("hp-run") + " --nproc-per-node 3 " +
                       binary_path("hp-example") + " --throw-rank 1 --exit-code 5");
  EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 5) << r.output;
  EXPECT_LT(r.seconds, 20.0) << r.output;
  const size_t verdict = r.output.find("hp-run: FAILED: rank 1");
  ASSERT_NE(verdict, std::string::npos) << r.output;
  EXPECT_NE(r.output.find(": hp-example: rank 1: throwing on purpose", verdict), std::string::npos) << r.output;
}

// Two "nodes" on this machine (two hp-run, --nnodes 2, loopback)
// train dp 2 x tp 2 with the losses of one hp-run --nproc-per-node 4. The same ranks do
// the same work in both, so the losses agree exactly (the JSON keeps 17 digits).
TEST(MultiProcess, TwoNodesTrainDp2Tp2AsOneNodeOfFour) {
  const std::string base = compat::join_path(compat::temp_directory(), "hp_two_nodes_" + std::to_string(::getpid()));
  compat::remove_all(base);
  const std::string job =
      " --model.dim 32 --model.n_layers 1 --model.n_heads 4 --model.vocab_size 515"
      " --model.multiple_of 16 --model.max_seq_len 16 --training.seq_len 16 --training.batch_size 8"
      " --training.steps 4 --training.grad_accum_steps 2 --validation.enable false"
      " --metrics.enable_plot false --parallelism.data_parallel_degree 2"
      " --parallelism.tensor_parallel_degree 2";
  const std::string train = binary_path("hp-train");
  auto one =
      run_command(binary_path("hp-run") + " --nproc-per-node 4 " + train + job + " --job.dump_folder " + base + "/one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::string port = std::to_string(free_port());
  auto node = [&](int r) {
    return binary_path("hp-run") + " --nnodes 2 --node-rank " + std::to_string(r) +
           " --nproc-per-node 2 --master-addr 127.0.0.1 --master-port " + port + " " + train + job +
           " --job.dump_folder " + base + "/two";
  };
  // Node 1 in the background, node 0 (it hosts the store and writes the metrics) here.
  auto two = run_command("(" + node(1) + " > " + base + "/node1.log 2>&1; echo $? > " + base + "/node1.rc) & " +
                         node(0) + "; rc=$?; wait; exit $rc");
  std::ifstream rc_file(base + "/node1.rc");
  int node1_rc = -1;
  rc_file >> node1_rc;
  std::ifstream log1(base + "/node1.log");
  const std::string node1_log((std::istreambuf_iterator<char>(log1)), std::istreambuf_iterator<char>());
  ASSERT_EQ(two.exit_code, 0) << two.output;
  ASSERT_EQ(node1_rc, 0) << node1_log;
  const auto a = logged_losses(base + "/one"), b = logged_losses(base + "/two");
  ASSERT_EQ(a.size(), 4u) << one.output;
  ASSERT_EQ(b.size(), 4u) << two.output;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
  compat::remove_all(base);
}

// FSDP through the launcher: four processes as dp_shard 2 x tp 2 train and validate with
// the losses of dp 2 x tp 2 (replicated), float64 (the same arithmetic up to summation
// order), and the metrics say how the sharding collectives went.
TEST(MultiProcess, FsdpShard2Tp2TrainsAsReplicatedDp2Tp2) {
  const std::string base = compat::join_path(compat::temp_directory(), "hp_fsdp_mp_" + std::to_string(::getpid()));
  compat::remove_all(base);
  const std::string job =
      " --model.dim 32 --model.n_layers 2 --model.n_heads 4 --model.vocab_size 515"
      " --model.multiple_of 16 --model.max_seq_len 16 --training.seq_len 16 --training.batch_size 8"
      " --training.steps 4 --training.dtype float64 --validation.freq 2 --metrics.enable_plot false"
      " --parallelism.tensor_parallel_degree 2";
  const std::string run = binary_path("hp-run") + " --nproc-per-node 4 " + binary_path("hp-train") + job;
  auto replicated = run_command(run + " --parallelism.data_parallel_degree 2 --job.dump_folder " + base + "/dp");
  ASSERT_EQ(replicated.exit_code, 0) << replicated.output;
  auto sharded = run_command(run + " --parallelism.data_parallel_shard_degree 2 --job.dump_folder " + base + "/fsdp");
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  EXPECT_NE(sharded.output.find("DP 1 x FSDP 2 x TP 2"), std::string::npos) << sharded.output;
  const auto a = logged_losses(base + "/dp"), b = logged_losses(base + "/fsdp");
  ASSERT_EQ(a.size(), 4u) << replicated.output;
  ASSERT_EQ(b.size(), 4u) << sharded.output;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-10 * a[i]) << "step " << i + 1;
  // Validation (steps 2 and 4) gathers the blocks without a backward and frees them again.
  const auto validation_losses = [](const std::string& dump) {
    std::ifstream in(dump + "/metrics/metrics.jsonl");
    std::vector<double> out;
    for (std::string line; std::getline(in, line);) {
      const auto rec = nlohmann::json::parse(line);
      if (rec.contains("val_loss")) out.push_back(rec.at("val_loss").get<double>());
    }
    return out;
  };
  const auto va = validation_losses(base + "/dp"), vb = validation_losses(base + "/fsdp");
  ASSERT_EQ(va.size(), 2u) << replicated.output;
  ASSERT_EQ(vb.size(), 2u) << sharded.output;
  for (size_t i = 0; i < va.size(); ++i) EXPECT_NEAR(va[i], vb[i], 1e-10 * va[i]) << "validation " << i + 1;
  std::ifstream in(base + "/fsdp/metrics/metrics.jsonl");
  std::string line;
  std::getline(in, line);
  const auto fsdp = nlohmann::json::parse(line).at("fsdp");
  EXPECT_EQ(fsdp.at("all_gathers").get<int64_t>(), 5);  // root + 2 blocks in forward, 2 blocks again in backward
  EXPECT_EQ(fsdp.at("reduce_scatters").get<int64_t>(), 3);
  EXPECT_EQ(fsdp.at("reduce_dtype").get<std::string>(), "float64");
  compat::remove_all(base);
}

}  // namespace multiprocess_test
