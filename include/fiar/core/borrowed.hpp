// SPDX-License-Identifier: Apache-2.0
// fiar/core/borrowed.hpp — a non-owning pointer that moves with its object: what lets workspaces and platforms keep
// the rule of zero (defaulted moves) and still tell a moved-from object from a live one.
// Contract: Borrowed<T> copies nothing: moving it leaves null behind; it never frees what it points to (the memory
// belongs to a platform's RAII handles).
#pragma once

#include <utility>

#include "prelude.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

template <class T>
class Borrowed {
 public:
  Borrowed() = default;
  explicit Borrowed(T* p) noexcept : p_(p) {}
  Borrowed(Borrowed&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  Borrowed& operator=(Borrowed&& other) noexcept {
    p_ = std::exchange(other.p_, nullptr);
    return *this;
  }
  [[nodiscard]] T* get() const noexcept { return p_; }
  T* operator->() const noexcept { return p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  T* p_ = nullptr;
};

}  // namespace detail
FIAR_END_NAMESPACE
