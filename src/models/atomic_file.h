// Files written whole or not at all: the bytes go to a temporary file next to the target,
// which is flushed, fsync'ed and renamed over it (then the folder is fsync'ed), so a crash
// or a full disk leaves either the old file or the new one under the name, never a
// truncated one, and no temporary file behind on an error. (hp-train's checkpoint files
// do the same with crash-injection points: train/checkpoint_io.h.)
#pragma once

#include <cstdio>
#include <functional>
#include <string>

namespace hyper_parallel::hf {

// `fill` writes the file's bytes to the stream it is given. Throws std::runtime_error naming
// `path` and the OS reason ("No space left on device", "Not a directory") on any failure.
void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& fill);

// fsync of `folder` ("" is the current one): makes the renames in it durable, not only the
// data renamed. Best effort (a folder that cannot be opened is left as it is).
void sync_folder(const std::string& folder);

}  // namespace hyper_parallel::hf
