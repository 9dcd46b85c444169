// group_description.h — what a Communicator's errors call its group.
//
// A failed collective (a timeout above all) is reported naming the operation, the group
// and its ranks; the mesh that creates a group says what it is ("mesh dim 'tp' of mesh
// [dp=2, tp=2]") and its timeout here, so that the public Communicator stays as it is.
#pragma once

#include <chrono>
#include <string>

#include "hyper_parallel/core/communicator.h"

namespace hyper_parallel {

// Kept until `comm` is destroyed.
void describe_group(const Communicator& comm, std::string where, std::chrono::milliseconds timeout);

}  // namespace hyper_parallel
