// Real processes through hp-run: the same library code over TCPStore + Gloo.
#include <gtest/gtest.h>

#include "harness/rank_harness.h"

using hyper_parallel::testing::binary_path;
using hyper_parallel::testing::run_command;

namespace {
int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}
}  // namespace

TEST(MultiProcess, ExamplePassesOnTwoAndFourRanks) {
  for (int n : {2, 4}) {
    auto r = run_command(binary_path("hp-run") + " --nproc-per-node " + std::to_string(n) + " " +
                         binary_path("hp-example"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(count(r.output, "all checks passed"), n) << r.output;
    EXPECT_EQ(count(r.output, "MISMATCH"), 0) << r.output;
    EXPECT_NE(r.output.find("[rank" + std::to_string(n - 1) + "]:"), std::string::npos) << r.output;
  }
}

TEST(MultiProcess, AFailingRankStopsTheOthersWithinSeconds) {
  // Rank 1 exits 3 while the others wait for it in a collective.
  auto r = run_command("HP_COLLECTIVE_TIMEOUT_S=120 " + binary_path("hp-run") +
                       " --nproc-per-node 4 " + binary_path("hp-example") +
                       " --fail-rank 1 --exit-code 3");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(r.seconds, 20.0) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("status 3"), std::string::npos) << r.output;
}
