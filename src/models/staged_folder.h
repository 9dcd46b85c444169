// A folder written whole or not at all: its files go into a hidden staging folder beside
// it (".<name>.hp-staging-<pid>"), which replaces the folder in one step once every file
// is written (Linux's renameat2 RENAME_EXCHANGE; where a file system lacks it, two renames,
// between which the folder is briefly absent but never mixed). Until then the folder
// holds exactly what it held before, so an export interrupted by a crash, a kill or a full
// disk leaves the earlier export intact, and nothing that reads the folder (our loader,
// transformers' from_pretrained) sees a mix of two. A staging folder left by a process
// that died is removed by the next one staging the same folder.
#pragma once

#include <functional>
#include <string>

namespace hyper_parallel::hf {

class StagedFolder {
 public:
  // Creates the staging folder beside `target` (and target's parent). Throws
  // std::runtime_error naming the path and the OS reason.
  explicit StagedFolder(const std::string& target);
  // Not committed: the staging folder and what was written into it are removed.
  ~StagedFolder();
  StagedFolder(const StagedFolder&) = delete;
  StagedFolder& operator=(const StagedFolder&) = delete;

  // Where the new files go.
  const std::string& path() const { return staging_; }
  // The staging folder becomes `target`. Entries of the old target that the staging folder
  // does not hold and `carry_over(name)` accepts move into the new one (the user's own
  // files beside an export); the rest of the old folder is removed. Throws
  // std::runtime_error naming the path and the OS reason (the old target then stays).
  void commit(const std::function<bool(const std::string& name)>& carry_over);

 private:
  std::string target_;
  std::string staging_;
  bool committed_ = false;
};

}  // namespace hyper_parallel::hf
