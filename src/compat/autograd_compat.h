// Autograd nodes across LibTorch versions: up to 2.14 a Node is owned by std::shared_ptr
// (created with deleteNode), from 2.15 it is an intrusive_ptr_target. The pointer type is
// read off `Edge::function`, so no version number is hard-coded here. And the C++ form of
// a post-accumulate-grad hook, whose slot LibTorch keeps for Python's.
#pragma once

#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <functional>

#include <memory>
#include <type_traits>
#include <utility>

namespace hyper_parallel::compat {

using NodePtr = decltype(torch::autograd::Edge::function);

inline constexpr bool kIntrusiveNodes = std::is_base_of_v<c10::intrusive_ptr_target, torch::autograd::Node>;

// A new autograd node of type T, owned the way this LibTorch owns nodes.
template <class T, class... Args>
NodePtr make_node(Args&&... args) {
  static_assert(std::is_base_of_v<torch::autograd::Node, T>);
  if constexpr (kIntrusiveNodes) {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  } else {
    return std::make_shared<T>(std::forward<Args>(args)...);
  }
}

// Runs `hook(leaf)` each time a backward has accumulated into the leaf tensor's .grad
// (PyTorch's register_post_accumulate_grad_hook): when the leaf's AccumulateGrad node runs,
// and not when torch::autograd::grad() only captures the leaf's gradient, as an activation
// checkpoint's recompute does (a tensor hook, register_hook, runs then too). One per leaf:
// it replaces an earlier one; an empty `hook` removes it.
inline void set_post_accumulate_grad_hook(const at::Tensor& leaf, std::function<void(const at::Tensor&)> hook) {
  struct Hook : torch::autograd::PostAccumulateGradHook {
    explicit Hook(std::function<void(const at::Tensor&)> fn) : fn(std::move(fn)) {}
    void operator()(const torch::autograd::Variable& tensor) override { fn(tensor); }
    std::function<void(const at::Tensor&)> fn;
  };
  torch::autograd::impl::set_post_acc_grad_hooks(leaf, hook ? std::make_unique<Hook>(std::move(hook)) : nullptr);
}

}  // namespace hyper_parallel::compat
