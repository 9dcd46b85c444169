// settings_test.cpp — environment variables are validated where they are read: a
// nonsense value is an error naming the variable, the value and the expected range,
// never a silent default or a 0 ms timeout.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <unistd.h>

#include <cstdlib>

#include "harness/rank_harness.h"
#include "hyper_parallel/core/distributed.h"

namespace settings_test {

using hyper_parallel::default_collective_timeout;
using hyper_parallel::testing::binary_path;
using hyper_parallel::testing::run_command;

namespace {

// Sets a variable for one scope (the tests run one at a time; no rank threads here).
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }
  const char* name_;
  std::string old_;
  bool had_ = false;
};

std::string timeout_error(const char* value) {
  ScopedEnv env("HP_COLLECTIVE_TIMEOUT_S", value);
  try {
    default_collective_timeout();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace

TEST(Settings, CollectiveTimeoutRejectsNonsenseNamingTheRange) {
  for (const char* bad : {"abc", "0", "-5", "", "10s", "nan", "inf", "1e9"}) {
    SCOPED_TRACE(bad);
    const std::string error = timeout_error(bad);
    EXPECT_NE(error.find("HP_COLLECTIVE_TIMEOUT_S='" + std::string(bad) + "'"), std::string::npos) << error;
    EXPECT_NE(error.find("expected a number of seconds in (0, 604800]"), std::string::npos) << error;
  }
}

TEST(Settings, CollectiveTimeoutAcceptsSecondsAndDefaultsTo300) {
  {
    ScopedEnv env("HP_COLLECTIVE_TIMEOUT_S", "2.5");
    EXPECT_EQ(default_collective_timeout().count(), 2500);
  }
  const char* old = std::getenv("HP_COLLECTIVE_TIMEOUT_S");
  if (!old) EXPECT_EQ(default_collective_timeout().count(), 300000);
}

// Through hp-train, as a user meets them: exit 1 with one clear line.
TEST(Settings, BadLauncherVariablesAreNamedByHpTrain) {
  const std::string train =
      binary_path("hp-train") +
      " --training.steps 1 --model.dim 32 --model.n_heads 4"
      " --model.vocab_size 128 --model.max_seq_len 16 --training.seq_len 8"
      " --metrics.enable_plot false --validation.enable false --job.dump_folder /tmp/hp_settings_" +
      std::to_string(::getpid());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=70000", "MASTER_PORT='70000'"},
      {"RANK=x WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511", "RANK='x'"},
      {"RANK=0 WORLD_SIZE=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511", "WORLD_SIZE='0'"},
      {"RANK=0 WORLD_SIZE=1 LOCAL_RANK=-1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511", "LOCAL_RANK='-1'"},
      {"RANK=0 WORLD_SIZE=1 HP_BACKEND=mpi MASTER_ADDR=127.0.0.1 MASTER_PORT=29511", "HP_BACKEND='mpi'"},
      {"HP_COLLECTIVE_TIMEOUT_S=abc RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511",
       "HP_COLLECTIVE_TIMEOUT_S='abc'"},
  };
  for (const auto& [env, needle] : cases) {
    SCOPED_TRACE(env);
    auto r = run_command(env + " " + train);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("expected"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("hp-train: hp-train:"), std::string::npos) << r.output;
  }
  run_command("rm -rf /tmp/hp_settings_" + std::to_string(::getpid()));
}

// Without MASTER_ADDR a rank other than 0 used to guess 127.0.0.1 and wait out the store's
// timeout (300 s) on any other machine, then fail without naming the variable.
TEST(Settings, AMissingMasterAddrWithOtherRanksIsAnImmediateNamedError) {
  const std::string train =
      binary_path("hp-train") +
      " --training.steps 1 --model.dim 32 --model.n_heads 4"
      " --model.vocab_size 128 --model.max_seq_len 16 --training.seq_len 8"
      " --metrics.enable_plot false --validation.enable false --job.dump_folder /tmp/hp_settings_addr_" +
      std::to_string(::getpid());
  // `timeout` bounds the run where the error is missing (a wait of the store's timeout).
  auto r = run_command("env -u MASTER_ADDR RANK=1 WORLD_SIZE=2 MASTER_PORT=29517 timeout 30 " + train);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 20.0) << r.output;
  EXPECT_NE(r.output.find("MASTER_ADDR is not set"), std::string::npos) << r.output;
  // One rank alone needs no address: 127.0.0.1 is then right.
  auto one = run_command("env -u MASTER_ADDR RANK=0 WORLD_SIZE=1 MASTER_PORT=29518 timeout 60 " + train);
  EXPECT_EQ(one.exit_code, 0) << one.output;
  run_command("rm -rf /tmp/hp_settings_addr_" + std::to_string(::getpid()));
}

}  // namespace settings_test
