// SPDX-License-Identifier: Apache-2.0
// The {backend x element type} cases of the host-emulator tests, derived from fiar::BackendPolicies and the element
// types fiar reduces, with what each case needs to run (its workspace type, topology and strategies); and
// FIAR_CASE_TEST, which writes a property once and registers one Catch2 test case per case, tagged with the case's
// backend (so the per-backend meson areas, [trtllm] [mnnvl] [nccl], run every property of their backend) and
// [backends]. Test code only.
#pragma once

#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "host_harness.hpp"
#include "reference.hpp"

namespace fiar_test {

// The topology a backend's host tests run on: one node with multicast (one_node) for a backend that needs peer
// mappings or multicast; otherwise the harshest one it accepts, a group spread over two nodes without peer access.
inline fiar::Topology anywhere(int world, int rank, int arch = 90) {
  return fiar::Topology{
      .world_size = world, .rank = rank, .node_count = world > 1 ? 2 : 1, .node_peer_access = false, .arch = arch};
}

template <class Policy>
fiar::Topology topology_for(int world, int rank, int arch = 90) {
  if constexpr (Policy::needs_peer_access || Policy::needs_multicast) {
    return one_node(world, rank, arch);
  } else {
    return anywhere(world, rank, arch);
  }
}

// One backend with one element type, on the host emulator.
template <class Policy, class T>
struct Case {
  using policy = Policy;
  using value_type = T;
  using workspace = HostWorkspace<T, Policy>;
  static constexpr fiar::Backend backend = Policy::backend;
  // A Lamport backend (trtllm, mnnvl) lets a call choose one-shot or two-shot; nccl takes Strategy::Auto only.
  static constexpr bool lamport = requires { workspace::buffer_words(1, 90, fiar::WorkspaceConfig{}); };

  // The strategies a call may name explicitly on this backend.
  static std::vector<Strategy> strategies() {
    if constexpr (lamport) {
      return {Strategy::OneShot, Strategy::TwoShot};
    } else {
      return {Strategy::Auto};
    }
  }
  static fiar::Topology topology(int world, int rank, int arch = 90) { return topology_for<Policy>(world, rank, arch); }
  // "trtllm", and "trtllm float" for test names.
  static std::string backend_name() { return std::string(fiar::to_string(backend)); }
  static std::string name() { return backend_name() + " " + dtype_label<T>(); }
};

namespace detail {

template <class Policy, class... Ts>
using cases_of_policy = std::tuple<Case<Policy, Ts>...>;

template <class Policies, class Types>
struct cross;
template <class... Ps, class... Ts>
struct cross<fiar::TypeList<Ps...>, fiar::TypeList<Ts...>> {
  using type = decltype(std::tuple_cat(std::declval<cases_of_policy<Ps, Ts...>>()...));
};

// Policy i with element type i % (number of types).
template <class Policies, class Types, class Index>
struct diagonal_impl;
template <class... Ps, class... Ts, std::size_t... Is>
struct diagonal_impl<fiar::TypeList<Ps...>, fiar::TypeList<Ts...>, std::index_sequence<Is...>> {
  using type = std::tuple<Case<Ps, std::tuple_element_t<Is % sizeof...(Ts), std::tuple<Ts...>>>...>;
};
template <class Policies, class Types>
struct diagonal;
template <class... Ps, class Types>
struct diagonal<fiar::TypeList<Ps...>, Types> {
  using type = typename diagonal_impl<fiar::TypeList<Ps...>, Types, std::index_sequence_for<Ps...>>::type;
};

template <class Cases, template <class> class Keep>
struct filter;
template <class... Cs, template <class> class Keep>
struct filter<std::tuple<Cs...>, Keep> {
  using type =
      decltype(std::tuple_cat(std::declval<std::conditional_t<Keep<Cs>::value, std::tuple<Cs>, std::tuple<>>>()...));
};

template <class C>
struct is_lamport : std::bool_constant<C::lamport> {};
template <class C>
struct is_float : std::is_same<typename C::value_type, float> {};

template <class, class... Ts>
struct drop_first {
  using type = fiar::TypeList<Ts...>;
};
// FIAR_FOR_EACH_DTYPE(X, _) expands to X(_, float) X(_, __half) ...: with this X, ", float , __half ...".
#define FIAR_TEST_DTYPE_ENTRY(unused, T) , T

}  // namespace detail

// The element types fiar reduces, as the library lists them.
using Dtypes = detail::drop_first<void FIAR_FOR_EACH_DTYPE(FIAR_TEST_DTYPE_ENTRY, _)>::type;
#undef FIAR_TEST_DTYPE_ENTRY

// Every backend x every element type: Case<Policy, T> for each Policy of fiar::BackendPolicies, each T of Dtypes.
using AllCases = detail::cross<fiar::BackendPolicies, Dtypes>::type;
// The cases a property is checked on: all of them; under ThreadSanitizer (which checks the memory ordering of the
// emulated protocols, the same code for every element type) one element type per backend, the backends taking the
// types in turn, so every type still runs (a third of the run time and of the build).
#if defined(__SANITIZE_THREAD__)
using Cases = detail::diagonal<fiar::BackendPolicies, Dtypes>::type;
static_assert(std::tuple_size_v<Cases> == fiar::BackendPolicies::size);
#else
using Cases = AllCases;
static_assert(std::tuple_size_v<Cases> == fiar::BackendPolicies::size * Dtypes::size);
#endif
// The cases whose calls may choose one-shot or two-shot (trtllm, mnnvl).
using LamportCases = detail::filter<Cases, detail::is_lamport>::type;
// One case per backend (its float case): for properties the element type plays no part in and whose cost is
// wall-clock waiting (timeouts).
using FloatCases = detail::filter<AllCases, detail::is_float>::type;

static_assert(std::tuple_size_v<FloatCases> == fiar::BackendPolicies::size);

namespace detail {

// Registers test(C) for each case C of the list as "name - <backend> <dtype>", tagged [<backend>][backends] + tags.
template <class... Cs, class PointerOf>
int register_cases(std::tuple<Cs...>*, const char* name, const char* tags, const Catch::SourceLineInfo& where,
                   PointerOf pointer_of) {
  ((void)Catch::AutoReg(
       Catch::makeTestInvoker(pointer_of(std::type_identity<Cs>{})), where, Catch::StringRef(),
       Catch::NameAndTags{std::string(name) + " - " + Cs::name(), "[" + Cs::backend_name() + "][backends]" + tags}),
   ...);
  return 0;
}

}  // namespace detail
}  // namespace fiar_test

#define FIAR_CASE_TEST_CAT2(a, b) a##b
#define FIAR_CASE_TEST_CAT(a, b) FIAR_CASE_TEST_CAT2(a, b)
#define FIAR_CASE_TEST_IMPL(Test, Registered, Name, Tags, List)                                             \
  template <class TestType>                                                                                 \
  static void Test();                                                                                       \
  namespace {                                                                                               \
  const int Registered =                                                                                    \
      ::fiar_test::detail::register_cases(static_cast<List*>(nullptr), Name, Tags, CATCH_INTERNAL_LINEINFO, \
                                          [](auto c) { return &Test<typename decltype(c)::type>; });        \
  }                                                                                                         \
  template <class TestType>                                                                                 \
  static void Test()

// FIAR_CASE_TEST("property", "[extra tags]", fiar_test::Cases) { ... TestType is the Case ... }: one test case per
// case of the list (a std::tuple of Case<Policy, T>), like TEMPLATE_LIST_TEST_CASE, but named and tagged per backend.
// Its names are numbered by __COUNTER__, expanded once: __LINE__ collides when two files of one unity translation unit
// have a test case on the same line.
#define FIAR_CASE_TEST(Name, Tags, List) FIAR_CASE_TEST_NUMBERED(Name, Tags, List, __COUNTER__)
#define FIAR_CASE_TEST_NUMBERED(Name, Tags, List, N)                                                              \
  FIAR_CASE_TEST_IMPL(FIAR_CASE_TEST_CAT(fiar_case_test_, N), FIAR_CASE_TEST_CAT(fiar_case_registered_, N), Name, \
                      Tags, List)
