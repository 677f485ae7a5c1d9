// SPDX-License-Identifier: Apache-2.0
// fiar/core/resolve.hpp — the backend choice: which backend runs on a topology, and why the others cannot.
// Contract: resolve_backend is constexpr; it validates an explicit choice (never replaces it) and throws
// std::invalid_argument naming the problem and the fix; in a constant expression a rejection is a compile error.
#pragma once

#include <stdexcept>
#include <string>

#include "backend.hpp"
#include "policy.hpp"
#include "prelude.hpp"
#include "topology.hpp"

FIAR_BEGIN_NAMESPACE

/// The outcome of the backend choice. allow_trtllm_fallback is true only when Auto chose Mnnvl on a
/// topology where Trtllm could also run: make_workspace may then fall back to Trtllm if multicast setup
/// fails on the machine. An explicit choice never allows a fallback.
struct Resolution {
  Backend backend;
  bool allow_trtllm_fallback;

  friend constexpr bool operator==(const Resolution&, const Resolution&) = default;
};

/// Why a backend cannot run on a topology (none: it can).
enum class Rejection { none, spans_nodes, world_size, peer_access, multicast, arch };

/// The first rule of policy P that the (well-formed) topology breaks, or Rejection::none.
template <AllreducePolicy P>
constexpr Rejection rejection_for(const Topology& t) noexcept {
  if (!P::multi_node && t.node_count > 1) return Rejection::spans_nodes;
  if (t.world_size < P::min_world_size || t.world_size > P::max_world_size) return Rejection::world_size;
  if (P::needs_peer_access && !t.node_peer_access) return Rejection::peer_access;
  if (P::needs_multicast && !t.multicast_supported) return Rejection::multicast;
  if (t.arch != 0 && t.arch < P::min_arch) return Rejection::arch;
  return Rejection::none;
}

/// rejection_for() of a concrete backend's policy; Auto (or a value outside the enumeration) is never rejected.
constexpr Rejection rejection_for(Backend b, const Topology& t) noexcept {
  Rejection r = Rejection::none;
  with_policy(b, [&](auto p) { r = rejection_for<typename decltype(p)::type>(t); });
  return r;
}

/// True when the backend's rules accept the (well-formed) topology.
constexpr bool can_run_on(Backend b, const Topology& t) noexcept { return rejection_for(b, t) == Rejection::none; }

/// Ranks of one node: the ranks per node of a group spread evenly (the most any node holds otherwise is unknown here).
constexpr int ranks_per_node(const Topology& t) noexcept {
  return t.node_count > 0 ? (t.world_size + t.node_count - 1) / t.node_count : t.world_size;
}

/// True when backend b can run on t but is expected to lose there to another backend: a Lamport all-to-all
/// protocol (trtllm) with more than its pcie_max_ranks ranks per node on a PCIe-only interconnect. Auto passes such a
/// backend by; an explicit request still runs it (with one warning, see expected_cost).
constexpr bool slow_on(Backend b, const Topology& t) noexcept {
  bool slow = false;
  with_policy(b, [&](auto p) {
    using P = typename decltype(p)::type;
    slow = t.interconnect == Interconnect::Pcie && ranks_per_node(t) > P::pcie_max_ranks;
  });
  return slow;
}

/// Why backend b is expected to be slow on t ("" when slow_on is false): the cost, and what to use instead.
inline std::string expected_cost(Backend b, const Topology& t) {
  if (!slow_on(b, t)) return "";
  const int w = ranks_per_node(t);
  return "backend '" + std::string(to_string(b)) + "' on a PCIe-only node of " + std::to_string(w) +
         " ranks: every rank pushes its data to " + std::to_string(w - 1) + " peers through the PCIe switches (about " +
         std::to_string(w - 1) +
         "x the traffic of NCCL's ring per link), so it is expected to be slower than 'nccl', which auto picks here";
}

/// The first backend of the automatic order (BackendPolicies) other than `excluded` that can run on t (Nccl at worst).
constexpr Backend best_alternative(Backend excluded, const Topology& t) noexcept {
  Backend best = Backend::Nccl;
  find_first(BackendPolicies{}, [&](auto p) {
    constexpr Backend b = decltype(p)::type::backend;
    if (b == excluded || !can_run_on(b, t)) return false;
    best = b;
    return true;
  });
  return best;
}

namespace detail {

inline std::string str(std::string_view s) { return std::string(s); }

// The "Fix:" sentence for a rejected backend: the best alternative and how to select it.
inline std::string fix_for(Backend rejected, const Topology& t) {
  const Backend alt = best_alternative(rejected, t);
  std::string why;
  if (alt == Backend::Mnnvl) {
    why = " (this group has NVLink multicast)";
  } else if (alt == Backend::Trtllm) {
    why = " (one node whose ranks can map each other's memory)";
  } else if (t.multicast_supported || rejected == Backend::Mnnvl) {
    why = " (it runs on any topology)";
  } else {
    why = " (it runs on any topology; 'mnnvl' would need NVLink multicast, which this group does not have)";
  }
  const std::string name = str(to_string(alt));
  std::string enumerator = name;
  enumerator[0] = static_cast<char>(enumerator[0] - 'a' + 'A');
  const std::string last_resort = alt == Backend::Nccl ? "" : " ('nccl' also works, on any topology)";
  return " Fix: use '" + name + "'" + why + ": set " + backend_env_var + "=" + name +
         " or request fiar::Backend::" + enumerator + last_resort + ", or use 'auto' to let fiar choose.";
}

inline std::string topology_suffix(const Topology& t) { return " [topology: " + to_string(t) + "]"; }

// Each rejection is a non-constexpr function named after the rule, so a rejected combination evaluated
// in a constant expression is a compile error whose note names the rule.
// `allowed` is completed by `bound` when bound >= 0 (kept as ints so the call stays a constant expression
// up to the throw).
[[noreturn]] inline void malformed_topology(const char* field, int value, const char* allowed, int bound = -1) {
  throw std::invalid_argument("fiar: malformed topology: " + std::string(field) + " = " + std::to_string(value) +
                              "; allowed: " + allowed + (bound >= 0 ? std::to_string(bound) : std::string()) +
                              ". Fix: take the topology from discover_topology() or fill it consistently.");
}

[[noreturn]] inline void backend_cannot_span_nodes(Backend b, const Topology& t) {
  throw std::invalid_argument(
      "fiar: backend '" + str(to_string(b)) + "' cannot run on a group that spans " + std::to_string(t.node_count) +
      " nodes: it maps GPU memory between ranks of one node only." + fix_for(b, t) + topology_suffix(t));
}

[[noreturn]] inline void backend_world_size_unsupported(Backend b, const Topology& t, int min_size, int max_size) {
  throw std::invalid_argument("fiar: backend '" + str(to_string(b)) + "' does not support world_size " +
                              std::to_string(t.world_size) + "; it supports world sizes " + std::to_string(min_size) +
                              " to " + std::to_string(max_size) + "." + fix_for(b, t) + topology_suffix(t));
}

[[noreturn]] inline void backend_needs_peer_access(Backend b, const Topology& t) {
  throw std::invalid_argument(
      "fiar: backend '" + str(to_string(b)) +
      "' needs every rank of the node to map every other rank's GPU memory (CUDA peer access), and this "
      "group cannot (node_peer_access = false; e.g. GPUs on PCIe without P2P, or ranks in containers that "
      "cannot share memory)." +
      fix_for(b, t) + topology_suffix(t));
}

[[noreturn]] inline void backend_needs_multicast(Backend b, const Topology& t) {
  throw std::invalid_argument(
      "fiar: backend '" + str(to_string(b)) +
      "' needs NVLink multicast (NVSwitch multicast on every rank's GPU, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED; "
      "across nodes also fabric handles through IMEX), and this group does not have it (multicast_supported = "
      "false)." +
      fix_for(b, t) + topology_suffix(t));
}

[[noreturn]] inline void backend_needs_newer_arch(Backend b, const Topology& t, int min_arch) {
  throw std::invalid_argument("fiar: backend '" + str(to_string(b)) + "' needs " + arch_name(min_arch) +
                              " or newer, and the group's lowest architecture is " + arch_name(t.arch) + "." +
                              fix_for(b, t) + topology_suffix(t));
}

template <AllreducePolicy P>
constexpr void enforce(const Topology& t) {
  switch (rejection_for<P>(t)) {
    case Rejection::none: return;
    case Rejection::spans_nodes: backend_cannot_span_nodes(P::backend, t);
    case Rejection::world_size: backend_world_size_unsupported(P::backend, t, P::min_world_size, P::max_world_size);
    case Rejection::peer_access: backend_needs_peer_access(P::backend, t);
    case Rejection::multicast: backend_needs_multicast(P::backend, t);
    case Rejection::arch: backend_needs_newer_arch(P::backend, t, P::min_arch);
  }
}

}  // namespace detail

/// Throws std::invalid_argument unless 1 <= world_size, 0 <= rank < world_size,
/// 1 <= node_count <= world_size and arch >= 0.
constexpr void validate_topology(const Topology& t) {
  if (t.world_size < 1) detail::malformed_topology("world_size", t.world_size, "1 or more");
  if (t.rank < 0 || t.rank >= t.world_size) {
    detail::malformed_topology("rank", t.rank, "0 to world_size - 1 = ", t.world_size - 1);
  }
  if (t.node_count < 1 || t.node_count > t.world_size) {
    detail::malformed_topology("node_count", t.node_count, "1 to world_size = ", t.world_size);
  }
  if (t.arch < 0) detail::malformed_topology("arch", t.arch, "0 (unknown) or a compute capability x10, e.g. 90");
  if (t.interconnect != Interconnect::Unknown && t.interconnect != Interconnect::Pcie &&
      t.interconnect != Interconnect::NvLink) {
    detail::malformed_topology("interconnect", static_cast<int>(t.interconnect), "Unknown (0), Pcie (1) or NvLink (2)");
  }
}

/// Chooses the backend for a topology.
/// - malformed topology, or `requested` outside the enumeration: std::invalid_argument;
/// - Trtllm, Mnnvl, Nccl: validated against the policy's rules and returned unchanged, or std::invalid_argument
///   naming the broken rule and the fix;
/// - Auto: the first backend of BackendPolicies (mnnvl, trtllm, nccl) that can run and is not slow_on the topology
///   (trtllm on a PCIe-only node of more than 2 ranks); a fallback is allowed when the chosen policy names one
///   (mnnvl: trtllm) and that one can run (and is not slow) too; never throws for a well-formed topology.
constexpr Resolution resolve_backend(Backend requested, const Topology& t) {
  check_backend(requested);
  validate_topology(t);
  if (requested != Backend::Auto) {
    with_policy(requested, [&](auto p) { detail::enforce<typename decltype(p)::type>(t); });
    return {requested, false};
  }
  Resolution chosen{Backend::Nccl, false};
  find_first(BackendPolicies{}, [&](auto p) {
    using P = typename decltype(p)::type;
    if (!can_run_on(P::backend, t) || slow_on(P::backend, t)) return false;
    chosen = {P::backend,
              P::setup_fallback != Backend::Auto && can_run_on(P::setup_fallback, t) && !slow_on(P::setup_fallback, t)};
    return true;
  });
  return chosen;
}

/// Applies P's rules to a topology: returns when P can run on it, throws std::invalid_argument otherwise
/// (a compile error when evaluated in a constant expression).
template <AllreducePolicy P>
constexpr void check_topology(const Topology& t) {
  validate_topology(t);
  detail::enforce<P>(t);
}

/// The policy Auto picks for a topology known at compile time.
template <Topology T>
using policy_for_t = policy_for_backend_t<resolve_backend(Backend::Auto, T).backend>;

/// A short reason why backend b cannot run on t, or "" when it can.
inline std::string why_not(Backend b, const Topology& t) {
  switch (rejection_for(b, t)) {
    case Rejection::none: return "";
    case Rejection::spans_nodes: return "the group spans " + std::to_string(t.node_count) + " nodes";
    case Rejection::world_size: return "world_size " + std::to_string(t.world_size) + " is outside its supported range";
    case Rejection::peer_access:
      return "node_peer_access is false (the node's ranks cannot map each other's memory, or a rank has no usable GPU)";
    case Rejection::multicast: return "no NVLink multicast across the group";
    case Rejection::arch: return "architecture " + arch_name(t.arch) + " is too old";
  }
  return "";
}

/// Why Backend::Auto passes backend b by on t: why_not(b, t) when b cannot run, else the expected cost when b is
/// slow_on t ("slower than nccl: ..."), else "".
inline std::string why_auto_skips(Backend b, const Topology& t) {
  if (std::string no = why_not(b, t); !no.empty()) return no;
  if (!slow_on(b, t)) return "";
  return "expected slower than nccl on a PCIe-only node of " + std::to_string(ranks_per_node(t)) +
         " ranks (each rank pushes to every peer)";
}

FIAR_END_NAMESPACE
