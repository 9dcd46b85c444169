// A c10d backend whose collectives complete the moment they are issued and move no data:
// the one process that uses it plays one rank of a world of any size (hp-dry-run builds a
// 1,024-rank job this way, on meta tensors). It follows c10d's FakeProcessGroup (the same
// semantics: all-reduce and broadcast leave the tensors as they are, all-gather copies the
// input into every output, reduce-scatter and scatter keep this rank's piece), which cannot
// be used from C++ as shipped: its header includes torch/csrc/utils.h, hence Python.h and
// pybind11, whose inline code needs libpython at link time.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace hyper_parallel::compat {

c10::intrusive_ptr<c10d::Backend> make_fake_backend(int rank, int size);

}  // namespace hyper_parallel::compat
