#include "compat/fake_backend.h"

#include "compat/meta_kernels.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

namespace hyper_parallel::compat {

namespace {

class CompletedWork final : public c10d::Work {
 public:
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  bool isCompleted() override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
    future->markCompleted();
    return future;
  }
};

c10::intrusive_ptr<c10d::Work> completed() { return c10::make_intrusive<CompletedWork>(); }

class FakeBackend final : public c10d::Backend {
 public:
  FakeBackend(int rank, int size) : Backend(rank, size) {}
  const std::string getBackendName() const override { return "fake"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>&, const c10d::BroadcastOptions&) override {
    return completed();
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) override {
    return completed();
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) override {
    // As a real backend writes the outputs: below autograd (the outputs may be views).
    at::AutoDispatchBelowAutograd below_autograd;
    for (auto& out : outputs.at(0)) out.copy_(inputs.at(0));
    return completed();
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions&) override {
    at::AutoDispatchBelowAutograd below_autograd;
    TORCH_CHECK(inputs.at(0).size() == static_cast<size_t>(getSize()), "fake reduce_scatter: expected ", getSize(),
                " inputs, got ", inputs.at(0).size());
    outputs.at(0).copy_(inputs.at(0).at(getRank()));
    return completed();
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& options) override {
    // Only the root has the pieces; another rank's output keeps what it held.
    if (getRank() == options.rootRank) {
      at::AutoDispatchBelowAutograd below_autograd;
      outputs.at(0).copy_(inputs.at(0).at(getRank()));
    }
    return completed();
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override { return completed(); }
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_fake_backend(int rank, int size) {
  TORCH_CHECK(rank >= 0 && rank < size, "fake process group: expected 0 <= rank < size, got rank ", rank, " of ", size);
  // A fake world runs on meta tensors (hp-dry-run).
  register_missing_meta_kernels();
  return c10::make_intrusive<FakeBackend>(rank, size);
}

}  // namespace hyper_parallel::compat
