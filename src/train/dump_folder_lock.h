// dump_folder_lock.h — one job per dump folder.
//
// Two jobs writing one folder interleave their checkpoints and metrics, and each one's
// start-up cleanup deletes the other's in-flight temporary files. So a job holds an
// advisory lock (flock, exclusive) on <dump_folder>/.hp-train.lock for its whole life:
// rank 0 does, and on a multi-node job each other node's local rank 0 too when that
// node does not see rank 0's lock file (a node-local dump folder). A second job is
// refused before it touches anything, naming the holder (pid and host, written into
// the lock file). The kernel drops the lock when the holder exits, however it exits, so a
// lock that can be taken proves that no earlier job in this folder is still writing:
// only then are temporary files of earlier saves removed. The file itself stays (deleting
// a lock file races with a job that has just opened it).
#pragma once

#include <string>

namespace hyper_parallel::train {

class DumpFolderLock {
 public:
  // Creates `folder` (a file in its place is an error naming job.dump_folder), opens its
  // lock file and takes the lock without waiting, then records "pid <pid> host <host>"
  // in it. Throws std::runtime_error naming the folder and the holder when another
  // process holds it.
  explicit DumpFolderLock(const std::string& folder);
  ~DumpFolderLock();
  DumpFolderLock(const DumpFolderLock&) = delete;
  DumpFolderLock& operator=(const DumpFolderLock&) = delete;

  // What this lock wrote into the lock file: its holder, unique on the machine.
  const std::string& record() const { return record_; }

 private:
  int fd_ = -1;
  std::string record_;
};

// <folder>/.hp-train.lock
std::string dump_folder_lock_path(const std::string& folder);
// The holder record in `folder`'s lock file; "" when there is none.
std::string read_dump_folder_lock_record(const std::string& folder);

}  // namespace hyper_parallel::train
