// SPDX-License-Identifier: Apache-2.0
// fiar/comm/discover.hpp — collective topology discovery over a Bootstrap.
// Contract: every rank of the group calls it; every rank returns the same Topology (bar rank) or throws the
// same error; without a GPU it still returns a topology (no capabilities) and says why in the notes.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../core/backend.hpp"
#include "../core/prelude.hpp"
#include "../core/resolve.hpp"
#include "../core/text.hpp"
#include "../core/topology.hpp"
#include "../runtime/cuda.hpp"
#include "../runtime/nvml.hpp"
#include "../runtime/posix.hpp"
#include "agree.hpp"
#include "bootstrap.hpp"

FIAR_BEGIN_NAMESPACE

/// Overrides this rank's node identity; ranks with equal identities count as one node.
inline constexpr const char* node_id_env_var = "FIAR_NODE_ID";

/// Longest node identity kept verbatim; longer ones are replaced by a hash.
inline constexpr std::size_t max_node_id_length = 127;

namespace detail {

inline std::string hashed_if_long(std::string id) {
  if (id.size() <= max_node_id_length) return id;
  std::uint64_t h = fnv1a(id);
  char buf[17];
  for (int i = 15; i >= 0; --i, h >>= 4) buf[i] = "0123456789abcdef"[h & 0xf];
  buf[16] = '\0';
  return std::string("hash:") + buf;
}

}  // namespace detail

/// This process's node identity. The rule: two ranks are on one node when they run under the same kernel
/// instance (boot_id) and in the same IPC namespace, which is what sharing GPU memory between processes
/// needs. A hostname alone is not enough: containers on one machine have different hostnames, and
/// unrelated machines can share one. FIAR_NODE_ID, when set and not blank, replaces the rule
/// (surrounding whitespace ignored).
inline std::string default_node_id() {
  if (const char* env = std::getenv(node_id_env_var); env != nullptr && !detail::trim(env).empty()) {
    return detail::hashed_if_long(std::string(detail::trim(env)));
  }
  std::string boot = detail::read_first_line("/proc/sys/kernel/random/boot_id");
  std::array<char, 256> ns{};
  const ssize_t n = ::readlink("/proc/self/ns/ipc", ns.data(), ns.size() - 1);
  std::string ipc = n > 0 ? std::string(ns.data(), static_cast<std::size_t>(n)) : std::string();
  if (boot.empty()) {
    std::array<char, 256> host{};
    if (::gethostname(host.data(), host.size() - 1) == 0) boot = std::string("host:") + host.data();
  }
  return detail::hashed_if_long("boot:" + boot + "/" + ipc);
}

/// What one rank can see of its own GPU (the calling thread's current CUDA device).
struct LocalDevice {
  bool usable = false;          ///< a CUDA device is current and answered queries
  int device = -1;              ///< its CUDA ordinal in this process
  int arch = 0;                 ///< compute capability x10, 0 when unknown
  bool multicast = false;       ///< CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
  bool fabric_handles = false;  ///< CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED
  std::string pci_bus_id;       ///< e.g. "0000:17:00.0"; ranks with equal ids share one GPU
  std::string node_id = default_node_id();
  std::string error;  ///< why the device is unusable, or which capability could not be read
  /// Can this device map memory of the GPU with that PCI bus id? Empty: yes whenever usable.
  std::function<bool(const std::string& peer_pci_bus_id)> can_map_peer;
  /// How this device reaches the GPU with that PCI bus id (NVML's NVLink P2P status). Empty: Unknown.
  std::function<Interconnect(const std::string& peer_pci_bus_id)> link_to_peer;
};

/// Probes the calling thread's current CUDA device. Never throws; without a usable device it returns
/// usable = false with the CUDA error in `error`.
inline LocalDevice probe_local_device() {
  LocalDevice d;
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    d.error = "no usable CUDA device (" + (e != cudaSuccess ? detail::describe_cuda(e) : "no CUDA device found") + ")";
    (void)cudaGetLastError();
    return d;
  }
  int dev = -1;
  int major = 0;
  int minor = 0;
  std::array<char, 32> bus{};
  if (cudaError_t e = cudaGetDevice(&dev);
      e != cudaSuccess || (e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) != cudaSuccess ||
      (e = cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), dev)) != cudaSuccess) {
    d.error = "no usable CUDA device (" + detail::describe_cuda(e) + ")";
    (void)cudaGetLastError();
    return d;
  }
  d.usable = true;
  d.device = dev;
  d.arch = major * 10 + minor;
  d.pci_bus_id = bus.data();
  int multicast = 0;
  int fabric = 0;
  if (!detail::driver_attribute(dev, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, multicast) ||
      !detail::driver_attribute(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, fabric)) {
    d.error =
        "the CUDA driver did not answer the multicast / fabric-handle attribute queries (driver older than "
        "CUDA 12.0?): both count as unsupported";
  }
  d.multicast = multicast != 0;
  d.fabric_handles = fabric != 0;
  d.can_map_peer = [dev](const std::string& peer_bus) {
    int peer = -1;
    if (cudaDeviceGetByPCIBusId(&peer, peer_bus.c_str()) != cudaSuccess) {
      (void)cudaGetLastError();
      return true;  // not visible to this process: the platform checks the mapping when it creates it
    }
    int can = 0;
    if (peer == dev) return true;
    if (cudaDeviceCanAccessPeer(&can, dev, peer) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return can != 0;
  };
  d.link_to_peer = [bus = d.pci_bus_id](const std::string& peer_bus) {
    const auto nvlink = detail::nvlink_between(bus, peer_bus);
    return !nvlink ? Interconnect::Unknown : *nvlink ? Interconnect::NvLink : Interconnect::Pcie;
  };
  return d;
}

/// Values the caller knows better than discovery. Each set field replaces the discovered one; every rank
/// must pass the same overrides (discovery checks that all ranks end with the same topology).
struct TopologyOverrides {
  std::optional<int> node_count = std::nullopt;
  std::optional<bool> multicast_supported = std::nullopt;
  std::optional<bool> fabric_handles_supported = std::nullopt;
  std::optional<bool> node_peer_access = std::nullopt;
  std::optional<int> arch = std::nullopt;
  std::optional<std::string> node_id = std::nullopt;  ///< this rank's node identity (default: default_node_id())
  std::optional<Interconnect> interconnect = std::nullopt;
};

/// A discovered topology with the per-rank node layout and human-readable notes on what was found.
struct DiscoveryReport {
  Topology topology;
  std::vector<int> node_of_rank;   ///< node index of each rank (see node_index_of_ranks)
  std::vector<std::string> notes;  ///< why a capability is missing, which overrides applied, ...
};

namespace detail {

struct RankRecord {
  std::array<char, max_node_id_length + 1> node_id;
  std::array<char, 32> pci_bus_id;
  std::int32_t usable;
  std::int32_t arch;
  std::int32_t multicast;
  std::int32_t fabric;
};

}  // namespace detail

/// Collective: discovers the group's topology from each rank's LocalDevice.
/// - node_count: distinct node identities among the group's ranks (this group, not the whole job);
/// - multicast_supported: every rank's GPU supports multicast, and, when the group spans nodes, every rank
///   also supports fabric handles (multicast across nodes goes through the NVLink fabric);
/// - fabric_handles_supported: every rank; node_peer_access: every rank can map every same-node peer;
/// - arch: the lowest architecture among the ranks (0 when no rank has a usable device).
/// Overrides replace discovered values. Throws std::invalid_argument on every rank when the ranks end
/// with different topologies (different overrides), fiar::timeout_error when a rank does not arrive.
template <Bootstrap B>
DiscoveryReport discover_topology_report(B& boot, const LocalDevice& local, const TopologyOverrides& overrides = {}) {
  DiscoveryReport report;
  const int world = boot.size();
  const int me = boot.rank();

  detail::RankRecord mine{};
  const std::string node_id = detail::hashed_if_long(overrides.node_id.value_or(local.node_id));
  detail::copy_text(mine.node_id, node_id);
  detail::copy_text(mine.pci_bus_id, local.usable ? local.pci_bus_id : std::string());
  mine.usable = local.usable ? 1 : 0;
  mine.arch = local.usable ? local.arch : 0;
  mine.multicast = local.usable && local.multicast ? 1 : 0;
  mine.fabric = local.usable && local.fabric_handles ? 1 : 0;
  const std::vector<detail::RankRecord> all = detail::agree(boot, {}, mine, "topology discovery");

  std::vector<std::string_view> ids;
  ids.reserve(all.size());
  for (const auto& r : all) ids.emplace_back(r.node_id.data());
  report.node_of_rank = node_index_of_ranks(ids);

  // Peer access and the interconnect: this rank checks every other rank of its node, then the group votes.
  // Link vote: 0 no same-node peer, 1 every peer over NVLink, 2 a peer it cannot classify, 3 a peer over PCIe only.
  std::int32_t link = 0;
  std::int32_t peers_ok = local.usable ? 1 : 0;
  for (int r = 0; r < world; ++r) {
    const auto& peer = all[static_cast<std::size_t>(r)];
    if (r == me ||
        report.node_of_rank[static_cast<std::size_t>(r)] != report.node_of_rank[static_cast<std::size_t>(me)]) {
      continue;
    }
    const std::string bus = peer.pci_bus_id.data();
    const bool same_gpu = bus == local.pci_bus_id;
    if (peers_ok && !peer.usable) {
      peers_ok = 0;
    } else if (peers_ok && !same_gpu && local.can_map_peer && !local.can_map_peer(bus)) {
      peers_ok = 0;
      report.notes.push_back("rank " + std::to_string(me) + " (GPU " + local.pci_bus_id +
                             ") cannot map the memory of rank " + std::to_string(r) + " (GPU " + bus +
                             "): no CUDA peer access between them");
    }
    if (same_gpu && local.usable) continue;  // ranks sharing one GPU use no link: no link vote
    const Interconnect i =
        local.usable && peer.usable && local.link_to_peer ? local.link_to_peer(bus) : Interconnect::Unknown;
    link = std::max(link, i == Interconnect::Pcie ? 3 : i == Interconnect::Unknown ? 2 : 1);
  }
  const std::vector<std::int32_t> peer_votes = detail::agree(boot, {}, peers_ok, "topology discovery");
  const std::vector<std::int32_t> link_votes = detail::agree(boot, {}, link, "topology discovery");

  Topology t;
  t.world_size = world;
  t.rank = me;
  t.node_count = count_nodes(ids);
  bool all_usable = true;
  bool all_multicast = true;
  bool all_fabric = true;
  std::vector<int> unusable;
  for (int r = 0; r < world; ++r) {
    const auto& rec = all[static_cast<std::size_t>(r)];
    if (!rec.usable) unusable.push_back(r);
    all_usable = all_usable && rec.usable;
    all_multicast = all_multicast && rec.multicast;
    all_fabric = all_fabric && rec.fabric;
    if (rec.arch > 0) t.arch = t.arch == 0 ? rec.arch : std::min(t.arch, static_cast<int>(rec.arch));
  }
  t.fabric_handles_supported = all_usable && all_fabric;
  t.multicast_supported = all_usable && all_multicast && (t.node_count == 1 || t.fabric_handles_supported);
  t.node_peer_access = std::all_of(peer_votes.begin(), peer_votes.end(), [](std::int32_t v) { return v != 0; });
  // Pcie when any pair of a node is PCIe only; NvLink when every pair is NVLink; Unknown when a pair could not be
  // classified (no NVML), or no node holds two ranks.
  const std::int32_t worst = *std::max_element(link_votes.begin(), link_votes.end());
  t.interconnect = worst == 3 ? Interconnect::Pcie : worst == 1 ? Interconnect::NvLink : Interconnect::Unknown;
  if (worst == 3) {
    std::vector<int> pcie;
    for (int r = 0; r < world; ++r) {
      if (link_votes[static_cast<std::size_t>(r)] == 3) pcie.push_back(r);
    }
    report.notes.push_back(
        "interconnect: PCIe only between some ranks of a node (NVML reports no NVLink path from "
        "rank(s) " +
        detail::rank_list(pcie) + " to a peer of their node)");
  }
  if (!local.usable) {
    report.notes.push_back("rank " + std::to_string(me) + ": " +
                           (local.error.empty() ? std::string("no usable CUDA device") : local.error) +
                           "; multicast, fabric handles and peer access count as unavailable");
  } else if (!local.error.empty()) {
    report.notes.push_back("rank " + std::to_string(me) + ": " + local.error);
  }
  if (!unusable.empty()) {
    report.notes.push_back("ranks without a usable CUDA device: " + detail::rank_list(unusable));
  }
  if (all_usable && all_multicast && t.node_count > 1 && !t.fabric_handles_supported) {
    report.notes.push_back("every GPU supports multicast, but the group spans " + std::to_string(t.node_count) +
                           " nodes and not every rank supports fabric handles (IMEX): no multicast across nodes");
  }

  auto apply = [&report](auto& field, const auto& value, const char* name) {
    if (!value) return;
    auto text = [](auto v) {
      if constexpr (std::is_same_v<decltype(v), bool>) {
        return std::string(v ? "yes" : "no");
      } else {
        return std::to_string(v);
      }
    };
    if (field != *value) {
      report.notes.push_back(std::string(name) + " overridden by the caller: " + text(*value) + " (discovered " +
                             text(field) + ")");
    }
    field = *value;
  };
  apply(t.node_count, overrides.node_count, "node_count");
  apply(t.multicast_supported, overrides.multicast_supported, "multicast_supported");
  apply(t.fabric_handles_supported, overrides.fabric_handles_supported, "fabric_handles_supported");
  apply(t.node_peer_access, overrides.node_peer_access, "node_peer_access");
  apply(t.arch, overrides.arch, "arch");
  if (overrides.interconnect && t.interconnect != *overrides.interconnect) {
    report.notes.push_back("interconnect overridden by the caller: " + std::string(to_string(*overrides.interconnect)) +
                           " (discovered " + std::string(to_string(t.interconnect)) + ")");
  }
  if (overrides.interconnect) t.interconnect = *overrides.interconnect;

  // Every rank must hold the same topology: compare everyone's (rank-less) result, then validate it, so
  // that every rank throws the same error (an override can make the topology malformed).
  Topology shared = t;
  shared.rank = 0;
  const std::vector<Topology> everyone = detail::agree(boot, {}, shared, "topology discovery");
  for (int r = 0; r < world; ++r) {
    if (everyone[static_cast<std::size_t>(r)] != everyone[0]) {
      throw std::invalid_argument("fiar: discover_topology: ranks disagree about the topology: rank 0 has {" +
                                  to_string(everyone[0]) + "}, rank " + std::to_string(r) + " has {" +
                                  to_string(everyone[static_cast<std::size_t>(r)]) +
                                  "}. Fix: pass the same TopologyOverrides on every rank.");
    }
  }
  validate_topology(t);
  report.topology = t;
  return report;
}

/// Collective: discover_topology_report() for the calling thread's current CUDA device.
template <Bootstrap B>
DiscoveryReport discover_topology_report(B& boot, const TopologyOverrides& overrides = {}) {
  return discover_topology_report(boot, probe_local_device(), overrides);
}

/// Collective: the group's Topology (see discover_topology_report for the rules).
template <Bootstrap B>
Topology discover_topology(B& boot, const TopologyOverrides& overrides = {}) {
  return discover_topology_report(boot, overrides).topology;
}

FIAR_END_NAMESPACE
