// Autograd nodes across LibTorch versions: up to 2.14 a Node is owned by std::shared_ptr
// (created with deleteNode), from 2.15 it is an intrusive_ptr_target. The pointer type is
// read off `Edge::function`, so no version number is hard-coded here.
#pragma once

#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>

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

}  // namespace hyper_parallel::compat
