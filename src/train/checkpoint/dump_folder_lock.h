// dump_folder_lock.h — one job per folder it writes.
//
// Two jobs writing one folder interleave their checkpoints and metrics, and each one's
// start-up cleanup deletes the other's in-flight temporary files. So a job holds an
// advisory lock (flock, exclusive) on <folder>/.hp-train.lock for its whole life, in every
// folder it writes: job.dump_folder, checkpoint.folder, metrics.folder, wherever they live
// (an absolute checkpoint.folder may be another job's). rank 0 does, and on a multi-node
// job each other node's local rank 0 too when that node does not see rank 0's lock file
// (a node-local folder). The lock file is opened through the folder's path, so a symlink
// leads to the same lock. A second job is refused before it touches anything, naming the
// folder, the key that named it and the holder (pid and host, written into the lock
// file). The kernel drops the lock when the holder exits, however it exits, so a lock that
// can be taken proves that no earlier job in this folder is still writing: only then are
// temporary files of earlier saves removed. The file itself stays (deleting a lock file
// races with a job that has just opened it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hyper_parallel::train {

class DumpFolderLock {
 public:
  // Creates `folder` (a file in its place is an error naming `key`, the setting that named
  // the folder: "job.dump_folder", "checkpoint.folder" ...), opens its lock file and takes
  // the lock without waiting, then records "pid <pid> host <host>" in it. Throws
  // std::runtime_error naming the key, the folder and the holder when another process
  // holds it.
  explicit DumpFolderLock(const std::string& folder, const std::string& key = "job.dump_folder");
  ~DumpFolderLock();
  DumpFolderLock(const DumpFolderLock&) = delete;
  DumpFolderLock& operator=(const DumpFolderLock&) = delete;

  // What this lock wrote into the lock file: its holder, unique on the machine.
  const std::string& record() const { return record_; }
  // The folder's identity on disk: (device, inode).
  std::pair<uint64_t, uint64_t> folder_id() const { return folder_id_; }

 private:
  int fd_ = -1;
  std::string record_;
  std::pair<uint64_t, uint64_t> folder_id_{0, 0};
};

// Locks each folder of `folders` ({key, path}, in order) once: a folder that is one locked
// before it (the same device and inode once created: the same path, or a symlink to it) is
// skipped, so that a job naming one folder twice (checkpoint.folder = the dump folder) is
// not refused by itself. Throws as DumpFolderLock, releasing what it took.
std::vector<std::unique_ptr<DumpFolderLock>> lock_folders(
    const std::vector<std::pair<std::string, std::string>>& folders);

// <folder>/.hp-train.lock
std::string dump_folder_lock_path(const std::string& folder);
// The holder record in `folder`'s lock file; "" when there is none.
std::string read_dump_folder_lock_record(const std::string& folder);

}  // namespace hyper_parallel::train
