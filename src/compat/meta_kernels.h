// Meta kernels (output shape and dtype, no data) for the ATen and c10d ops a training step
// runs that LibTorch's C++ build has none for: PyTorch defines them in Python
// (torch/_meta_registrations.py), which a C++ program does not load. hp-dry-run runs a
// whole step on meta tensors and needs them: where, index_select (the embeddings),
// embedding_dense_backward, abs (logsumexp, isfinite), logical_and/or/not, dot; and the
// c10d collectives, which on a fake process group (fake_backend.h) pass meta tensors to
// the fake backend (a real group refuses them); and two routes to the DTensor's kernels
// that Meta's rank above PrivateUse1 in dispatch would bypass (cross_entropy_loss with a
// meta target, _to_copy to the meta device).
#pragma once

namespace hyper_parallel::compat {

// Registers each kernel the running LibTorch lacks (none it has: a later LibTorch's own
// kernels are kept). Idempotent and thread-safe.
void register_missing_meta_kernels();

}  // namespace hyper_parallel::compat
