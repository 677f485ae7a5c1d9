// SPDX-License-Identifier: Apache-2.0
// fiar/core/type_list.hpp — a list of types, for the sets fiar writes once and derives the rest from (the
// backends' policies in their automatic order, the workspaces of AnyWorkspace, the tests' {policy x dtype} cases).
// Contract: compile-time only; apply<List, F> instantiates F with the list's types, contains<List, X> tests
// membership.
#pragma once

#include <type_traits>

#include "prelude.hpp"

FIAR_BEGIN_NAMESPACE

/// A list of types.
template <class... Ts>
struct TypeList {
  static constexpr int size = static_cast<int>(sizeof...(Ts));
};

namespace detail {
template <class List, template <class...> class F>
struct apply_list;
template <class... Ts, template <class...> class F>
struct apply_list<TypeList<Ts...>, F> {
  using type = F<Ts...>;
};
template <class List, class X>
struct list_contains;
template <class... Ts, class X>
struct list_contains<TypeList<Ts...>, X> : std::bool_constant<(std::is_same_v<Ts, X> || ...)> {};
}  // namespace detail

/// F<Ts...> for List = TypeList<Ts...>.
template <class List, template <class...> class F>
using apply_t = typename detail::apply_list<List, F>::type;

/// Whether X is one of List's types.
template <class List, class X>
inline constexpr bool contains_v = detail::list_contains<List, X>::value;

/// Calls f(std::type_identity<T>{}) for each T of List, in order, until f returns true; returns whether one did.
template <class... Ts, class F>
constexpr bool find_first(TypeList<Ts...>, F&& f) {
  return (f(std::type_identity<Ts>{}) || ...);
}

FIAR_END_NAMESPACE
