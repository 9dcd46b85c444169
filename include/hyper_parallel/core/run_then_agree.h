// "Try, then agree across ranks": the one way a job's ranks stop together when a step of
// theirs (a file written, a checkpoint read, a folder locked) fails on some of them only.
// A rank that stopped alone would leave the others waiting in their next collective until
// it times out, naming nothing; here every rank learns at once which ranks failed.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// Runs `fn` on this rank, then (a collective over every dim of `mesh`) every rank throws
// when any rank's `fn` threw: a rank that failed throws std::runtime_error with its own
// message; the others throw PeerFailure (fatal_error.h) "<what> failed on rank(s) R (their
// error says why); stopping every rank". Without a mesh (one rank) `fn`'s error is
// rethrown as std::runtime_error with its message.
void run_then_agree(const std::string& what, const std::optional<DeviceMesh>& mesh, const std::function<void()>& fn);

}  // namespace hyper_parallel

HP_PUBLIC_END
