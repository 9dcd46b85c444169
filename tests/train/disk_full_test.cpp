// disk_full_test.cpp — hp-train on a full disk (a small tmpfs): a clear error naming
// the file and "No space left on device", a non-zero exit without abort or backtrace,
// no temporary files left, and no torn metrics line. Mounting needs root
// (the CI runs as root); elsewhere the tests skip, saying why.
#include <gtest/gtest.h>

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "compat/file_system.h"
#include "harness/rank_harness.h"
#include "train/data/token_id_file.h"

namespace disk_full_test {

using hyper_parallel::testing::binary_path;
using hyper_parallel::testing::run_command;
namespace compat = hyper_parallel::compat;

namespace {

const char* kTinyJob =
    " --model.dim 32 --model.n_layers 1 --model.n_heads 4 --model.vocab_size 512 --model.multiple_of 16"
    " --model.max_seq_len 32 --training.seq_len 16 --training.batch_size 4 --lr_scheduler.warmup_steps 1"
    " --validation.enable false --metrics.enable_plot false";

class DiskFull : public ::testing::Test {
 protected:
  // A tmpfs of `size` (mount -o size=...) at a fresh folder.
  void mount_tmpfs(const std::string& size) {
    dir_ = compat::join_path(compat::temp_directory(),
                             "hp_disk_full_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    compat::remove_all(dir_);
    ASSERT_TRUE(compat::create_directories(dir_));
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, ("size=" + size).c_str()) != 0) {
      const int err = errno;
      ::rmdir(dir_.c_str());
      dir_.clear();
      GTEST_SKIP() << "cannot mount a tmpfs to fill (" << std::strerror(err)
                   << "): these tests need root or CAP_SYS_ADMIN, as in CI";
    }
  }
  void TearDown() override {
    if (dir_.empty()) return;
    ::umount2(dir_.c_str(), MNT_DETACH);
    compat::remove_all(dir_);
  }

  static void expect_clean_failure(const hyper_parallel::testing::CommandResult& r) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_LT(r.exit_code, 128) << "killed by a signal (abort?):\n" << r.output;
    for (const char* bad : {"terminate called", "Aborted", "Exception raised from", "frame #", "hp-train: hp-train:"}) {
      EXPECT_EQ(r.output.find(bad), std::string::npos) << "'" << bad << "' in:\n" << r.output;
    }
    EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  }

  bool has_temp_files() const {
    for (const auto& p : compat::list_directory_recursive(dir_)) {
      if (p.find(".tmp-") != std::string::npos) return true;
    }
    return false;
  }

  std::string dir_;
  static inline int counter_ = 0;
};

}  // namespace

TEST_F(DiskFull, ACheckpointThatDoesNotFitIsACleanErrorNamingTheFile) {
  mount_tmpfs("400k");  // one rank file (~290 kB) fits, two do not
  auto r = run_command(binary_path("hp-run") + " --nproc-per-node 2 " + binary_path("hp-train") + kTinyJob +
                       " --parallelism.tensor_parallel_degree 2 --training.steps 2 --checkpoint.enable"
                       " --checkpoint.interval 2 --job.dump_folder " +
                       dir_);
  expect_clean_failure(r);
  EXPECT_NE(r.output.find("checkpoints/step-2/rank-"), std::string::npos) << r.output;
  EXPECT_FALSE(has_temp_files()) << "a failed save must not leave its temporary files filling the disk";
  EXPECT_FALSE(compat::path_exists(dir_ + "/checkpoints/latest"));
}

TEST_F(DiskFull, AMetricsLineThatDoesNotFitIsNeitherTornNorSilent) {
  mount_tmpfs("64k");
  // The job's start-up writes must succeed so that the metrics file is what runs out of
  // room: the lock files of the dump and metrics folders exist already (rewritten in
  // place, no new page), and one page is left free for the start-up's write probes, which
  // the metrics file takes after them; its lines fill that page within a few steps.
  const std::string page(4096, 'x');
  std::ofstream(dir_ + "/.hp-train.lock", std::ios::binary) << std::string(200, ' ');
  ASSERT_TRUE(compat::create_directories(dir_ + "/metrics"));
  std::ofstream(dir_ + "/metrics/.hp-train.lock", std::ios::binary) << std::string(200, ' ');
  std::ofstream(dir_ + "/spare", std::ios::binary) << page;
  {  // Fill the disk.
    std::ofstream filler(dir_ + "/filler", std::ios::binary);
    while (filler.write(page.data(), static_cast<std::streamsize>(page.size()))) {
    }
  }
  ASSERT_EQ(std::remove((dir_ + "/spare").c_str()), 0);
  auto r = run_command(binary_path("hp-train") + kTinyJob + " --training.steps 40 --job.dump_folder " + dir_);
  expect_clean_failure(r);
  EXPECT_NE(r.output.find("metrics/metrics.jsonl"), std::string::npos) << r.output;
  std::ifstream in(dir_ + "/metrics/metrics.jsonl", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(text.empty() || text.back() == '\n') << "torn line: " << text;
}

// A corpus whose token ids do not fit in TMPDIR: the error names the corpus, the file and
// the reason, and says what to do; the unlinked file leaves nothing behind.
TEST_F(DiskFull, TokenIdsThatDoNotFitAreAnErrorNamingTheCorpusAndTheFolder) {
  mount_tmpfs("256k");
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  ::setenv("TMPDIR", dir_.c_str(), 1);
  std::string error;
  try {
    hyper_parallel::train::TokenIdFile ids("corpus 'words.txt'");
    for (int64_t i = 0; i < (int64_t{1} << 16) * 2; ++i) ids.append(i);  // 1 MiB
  } catch (const std::exception& e) {
    error = e.what();
  }
  old ? ::setenv("TMPDIR", saved.c_str(), 1) : ::unsetenv("TMPDIR");
  for (const std::string& part :
       {std::string("corpus 'words.txt': cannot write its token ids to the temporary file '") + dir_,
        std::string("No space left on device"), std::string("set TMPDIR")}) {
    EXPECT_NE(error.find(part), std::string::npos) << error;
  }
  EXPECT_TRUE(compat::list_directory(dir_).empty());
}

}  // namespace disk_full_test
