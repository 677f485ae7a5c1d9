// SPDX-License-Identifier: Apache-2.0
// fiar/core/topology.hpp — what fiar needs to know about a communicator group to pick a backend.
// Contract: Topology is a structural aggregate (usable as a template argument); count_nodes() is a pure
// function from per-rank node identities to the number of distinct nodes of the group.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "prelude.hpp"

FIAR_BEGIN_NAMESPACE

/// How the GPUs of a node reach each other: through NVLink (NVSwitch or direct links) or only through PCIe.
/// Unknown keeps the rules that do not depend on it (a topology from before this fact, or no way to tell).
enum class Interconnect { Unknown, Pcie, NvLink };

/// "unknown", "pcie", "nvlink".
constexpr std::string_view to_string(Interconnect i) noexcept {
  return i == Interconnect::Pcie ? "pcie" : i == Interconnect::NvLink ? "nvlink" : "unknown";
}

/// The facts about one communicator group that decide which backend can run on it.
/// Defaults: a single rank on one node whose GPUs can map each other's memory, with no NVLink multicast,
/// no fabric handles and an unknown architecture. Every rank of a group holds the same values except rank.
struct Topology {
  int world_size = 1;                     ///< ranks in the group (not the whole job)
  int rank = 0;                           ///< this rank, in [0, world_size)
  int node_count = 1;                     ///< distinct nodes among the group's ranks (see count_nodes)
  bool multicast_supported = false;       ///< NVLink multicast usable by the whole group (every rank; across
                                          ///< nodes this also needs fabric handles)
  bool fabric_handles_supported = false;  ///< every rank can export/import CU_MEM_HANDLE_TYPE_FABRIC memory
  bool node_peer_access = true;           ///< on every node, each rank can map every other rank's GPU memory
  int arch = 0;                           ///< lowest compute capability in the group x10 (90 = sm_90), 0 = unknown
  /// How the ranks of each node reach each other's GPUs: Pcie when any pair of a node has no NVLink path, NvLink
  /// when every pair has one, Unknown when discovery cannot tell (or the nodes hold one rank each).
  Interconnect interconnect = Interconnect::Unknown;

  friend constexpr bool operator==(const Topology&, const Topology&) = default;
};

/// Number of distinct node identities, i.e. the node count of the group whose ranks reported them.
/// Two ranks are on the same node exactly when their identities are equal (byte for byte).
constexpr int count_nodes(std::span<const std::string_view> identity_of_rank) noexcept {
  int nodes = 0;
  for (std::size_t i = 0; i < identity_of_rank.size(); ++i) {
    bool seen = false;
    for (std::size_t j = 0; j < i && !seen; ++j) seen = identity_of_rank[j] == identity_of_rank[i];
    if (!seen) ++nodes;
  }
  return nodes;
}

/// For each rank, the index of its node, numbered 0, 1, ... in order of each node's lowest rank.
inline std::vector<int> node_index_of_ranks(std::span<const std::string_view> identity_of_rank) {
  std::vector<int> index(identity_of_rank.size(), -1);
  int next = 0;
  for (std::size_t i = 0; i < identity_of_rank.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (identity_of_rank[j] == identity_of_rank[i]) {
        index[i] = index[j];
        break;
      }
    }
    if (index[i] < 0) index[i] = next++;
  }
  return index;
}

/// "sm_90" for arch 90, "unknown" for 0.
inline std::string arch_name(int arch) { return arch == 0 ? std::string("unknown") : "sm_" + std::to_string(arch); }

/// One-line human description, e.g. "world_size 16, rank 3, 2 nodes, multicast yes, fabric handles yes,
/// node peer access yes, arch sm_100" (", interconnect pcie" or ", interconnect nvlink" after it when known).
inline std::string to_string(const Topology& t) {
  auto yes_no = [](bool b) { return b ? "yes" : "no"; };
  return "world_size " + std::to_string(t.world_size) + ", rank " + std::to_string(t.rank) + ", " +
         std::to_string(t.node_count) + (t.node_count == 1 ? " node" : " nodes") + ", multicast " +
         yes_no(t.multicast_supported) + ", fabric handles " + yes_no(t.fabric_handles_supported) +
         ", node peer access " + yes_no(t.node_peer_access) + ", arch " + arch_name(t.arch) +
         (t.interconnect == Interconnect::Unknown ? std::string()
                                                  : ", interconnect " + std::string(to_string(t.interconnect)));
}

FIAR_END_NAMESPACE
