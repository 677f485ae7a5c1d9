// SPDX-License-Identifier: Apache-2.0
// fiar-check — preflight for the all-reduce backend choice.
// Prints the topology (discovered on this machine, or described with flags), which backends can run on it,
// what fiar chooses and why; for a rejected choice, the error and its fix (on stderr).
// Exit status: 0 the choice is valid, 1 topology discovery failed, 2 the choice is rejected or the command line is
// wrong (the same usage status as fiar-demo and fiar-bench).
#include <fiar/fiar.hpp>

#include "cli.hpp"

#include <charconv>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using fiar_cli::parse_int;
using fiar_cli::UsageError;

constexpr int kExitValid = fiar_cli::kExitOk;
constexpr int kExitDiscoveryFailed = fiar_cli::kExitFailed;
using fiar_cli::kExitRejected;

constexpr const char* kUsage = R"(usage: fiar-check [options]

Without topology options, fiar-check discovers this machine: one in-process rank per visible GPU.
With any of them, it checks the topology they describe instead.

topology options:
  --nodes N              nodes in the group (default 1)
  --gpus-per-node G      ranks per node (default 8); world size = nodes x gpus-per-node
  --world-size W         world size, when ranks are not spread evenly (default nodes x gpus-per-node)
  --rank R               this rank (default 0)
  --multicast yes|no     NVLink multicast across the group (default no)
  --fabric yes|no        fabric handles (IMEX) on every rank (default no)
  --peer-access yes|no   ranks of a node can map each other's memory (default yes)
  --arch sm_XY           lowest GPU architecture of the group, e.g. sm_90, sm_100 (default unknown)
  --interconnect pcie|nvlink|unknown
                         how the GPUs of a node reach each other (default unknown; with no other topology
                         option it overrides what discovery found)
choice:
  --backend NAME         auto, trtllm, mnnvl or nccl (default: $FIAR_ALLREDUCE_BACKEND, else auto)
output:
  --strategy-table       print the built-in strategy table (every architecture, interconnect and world-size
                         key) as JSON and exit
  -h, --help             this text
  --version              fiar-check's version

Each option takes its value as --flag value or --flag=value.
exit status: 0 the choice is valid, 1 topology discovery failed, 2 the choice is rejected or the command line is wrong
)";

bool parse_yes_no(std::string_view flag, std::string_view text) {
  if (text == "yes") return true;
  if (text == "no") return false;
  throw UsageError(std::string(flag) + " " + fiar_cli::quoted(text) + ": expected yes or no");
}

// "sm_90", "sm_90a", "sm_100f", "90" -> 90, 100; the suffix does not change the rules.
int parse_arch(std::string_view text) {
  std::string_view digits = text;
  if (digits.substr(0, 3) == "sm_") digits.remove_prefix(3);
  if (!digits.empty() && (digits.back() == 'a' || digits.back() == 'f')) digits.remove_suffix(1);
  int v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || v < 10) {
    throw UsageError("--arch " + fiar_cli::quoted(text) + ": expected an architecture such as sm_90 or sm_100");
  }
  return v;
}

fiar::Interconnect parse_interconnect(std::string_view flag, std::string_view text) {
  for (const auto i : {fiar::Interconnect::Pcie, fiar::Interconnect::NvLink, fiar::Interconnect::Unknown}) {
    if (text == fiar::to_string(i)) return i;
  }
  throw UsageError(std::string(flag) + " " + fiar_cli::quoted(text) + ": expected pcie, nvlink or unknown");
}

struct Options {
  std::optional<int> nodes, gpus_per_node, world_size, rank, arch;
  std::optional<bool> multicast, fabric, peer_access;
  std::optional<fiar::Interconnect> interconnect;
  std::optional<std::string> backend;
  bool strategy_table = false;

  [[nodiscard]] bool describes_topology() const {
    return nodes || gpus_per_node || world_size || rank || arch || multicast || fabric || peer_access;
  }
};

void add_options(fiar_cli::CommandLine& cli, Options& o) {
  const auto integer = [&cli](const char* name, std::optional<int>& target, int min) {
    cli.option(name,
               [&target, min](const std::string& flag, const std::string& v) { target = parse_int(flag, v, min); });
  };
  const auto yes_no = [&cli](const char* name, std::optional<bool>& target) {
    cli.option(name, [&target](const std::string& flag, const std::string& v) { target = parse_yes_no(flag, v); });
  };
  integer("--nodes", o.nodes, 1);
  integer("--gpus-per-node", o.gpus_per_node, 1);
  integer("--world-size", o.world_size, 1);
  integer("--rank", o.rank, 0);
  yes_no("--multicast", o.multicast);
  yes_no("--fabric", o.fabric);
  yes_no("--peer-access", o.peer_access);
  cli.option("--arch", [&o](const std::string&, const std::string& v) { o.arch = parse_arch(v); });
  cli.option("--interconnect",
             [&o](const std::string& flag, const std::string& v) { o.interconnect = parse_interconnect(flag, v); });
  cli.option("--backend", [&o](const std::string&, const std::string& v) { o.backend = v; });
  cli.flag("--strategy-table", o.strategy_table);
}

// "512 KiB", "32 MiB", "never".
std::string bytes_text(std::size_t b) {
  if (b == fiar::never) return "never";
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && b >= 1024 && b % 1024 == 0) {
    b /= 1024;
    ++u;
  }
  return std::to_string(b) + " " + units[u];
}

std::string json_bytes(std::size_t b) { return b == fiar::never ? "null" : std::to_string(b); }

// The built-in table at the keys scripts/model --table derives (tested against it: test/tools/check_table.py).
void print_strategy_table() {
  std::printf("[");
  const char* sep = "";
  for (int arch : {90, 100}) {
    for (fiar::Interconnect i : {fiar::Interconnect::NvLink, fiar::Interconnect::Pcie}) {
      for (int world : {2, 4, 8, 16}) {
        const fiar::StrategyThresholds t = fiar::default_strategy_thresholds(fiar::Backend::Mnnvl, arch, world, i);
        const fiar::StrategyThresholds tr = fiar::default_strategy_thresholds(fiar::Backend::Trtllm, arch, world, i);
        std::printf(
            "%s\n  {\"arch\": %d, \"interconnect\": \"%s\", \"world\": %d, \"trtllm_oneshot_max_bytes\": %zu, "
            "\"mnnvl_oneshot_max_bytes\": %zu, \"multimem_min_bytes\": %s, \"nccl_min_bytes\": %s, "
            "\"nccl_symmetric_max_bytes\": %zu}",
            sep, arch, std::string(fiar::to_string(i)).c_str(), world, tr.oneshot_max_bytes, t.oneshot_max_bytes,
            json_bytes(t.multimem_min_bytes).c_str(), json_bytes(t.nccl_min_bytes).c_str(), t.nccl_symmetric_max_bytes);
        sep = ",";
      }
    }
  }
  std::printf("\n]\n");
}

// The chosen backend's row of the strategy table for this topology: where Strategy::Auto changes path.
std::string strategy_row_text(fiar::Backend b, const fiar::Topology& t) {
  const fiar::StrategyThresholds r = fiar::strategy_thresholds(b, t, fiar::WorkspaceConfig{});
  if (b == fiar::Backend::Nccl) {
    return "ncclAllReduce for every size; on GPUs through the symmetric window up to " +
           bytes_text(r.nccl_symmetric_max_bytes) + " per rank";
  }
  std::string text = "one-shot up to " + bytes_text(r.oneshot_max_bytes) + " per rank, two-shot beyond";
  if (b == fiar::Backend::Mnnvl) {
    text += r.multimem_min_bytes == fiar::never ? "; multimem off (WorkspaceConfig::multimem_min_bytes turns it on)"
                                                : "; multimem from " + bytes_text(r.multimem_min_bytes);
  }
  text += r.nccl_min_bytes == fiar::never
              ? "; no NCCL step"
              : "; NCCL inside the workspace from " + bytes_text(r.nccl_min_bytes) + " (when max_token_num reaches it)";
  return text;
}

fiar::Topology described_topology(const Options& o) {
  const int nodes = o.nodes.value_or(1);
  const int per_node = o.gpus_per_node.value_or(8);
  if (o.world_size && o.gpus_per_node && *o.world_size != nodes * per_node) {
    throw UsageError("--world-size " + std::to_string(*o.world_size) + " contradicts --nodes " + std::to_string(nodes) +
                     " x --gpus-per-node " + std::to_string(per_node) + "; give one or the other");
  }
  fiar::Topology t;
  t.world_size = o.world_size.value_or(nodes * per_node);
  t.rank = o.rank.value_or(0);
  t.node_count = nodes;
  t.multicast_supported = o.multicast.value_or(false);
  t.fabric_handles_supported = o.fabric.value_or(false);
  t.node_peer_access = o.peer_access.value_or(true);
  t.arch = o.arch.value_or(0);
  t.interconnect = o.interconnect.value_or(fiar::Interconnect::Unknown);
  try {
    fiar::validate_topology(t);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  return t;
}

// One in-process rank per visible GPU (a single rank without one); returns rank 0's report.
fiar::DiscoveryReport discovered_topology(const fiar::TopologyOverrides& overrides) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  (void)cudaGetLastError();
  const int ranks = devices > 0 ? devices : 1;
  fiar::InProcessGroup group(ranks);
  std::vector<fiar::DiscoveryReport> reports(static_cast<std::size_t>(ranks));
  std::vector<std::string> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        if (devices > 0) cudaSetDevice(r);
        auto boot = group.bootstrap(r);
        reports[static_cast<std::size_t>(r)] = fiar::discover_topology_report(boot, overrides);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (!e.empty()) throw std::runtime_error(e);
  }
  // Notes from every rank matter (each rank explains its own device); keep rank 0's shared ones once.
  fiar::DiscoveryReport merged = reports[0];
  for (std::size_t r = 1; r < reports.size(); ++r) {
    for (const auto& n : reports[r].notes) {
      if (n.rfind("rank " + std::to_string(r), 0) == 0) merged.notes.push_back(n);
    }
  }
  return merged;
}

std::string why_chosen(fiar::Backend requested, const fiar::Resolution& res, const fiar::Topology& t) {
  if (requested != fiar::Backend::Auto) return "requested explicitly, and its rules accept this topology";
  // Auto's order is fiar::BackendPolicies: the first backend that can run (the last runs on any topology).
  std::string order, rejected;
  int index = 0;
  bool reached = false;
  fiar::find_first(fiar::BackendPolicies{}, [&](auto p) {
    const fiar::Backend b = decltype(p)::type::backend;
    const std::string name(fiar::to_string(b));
    const bool last = ++index == fiar::BackendPolicies::size;
    order += (order.empty() ? "auto picks " : ", else ") + name + (last ? "" : " when it can run");
    reached = reached || b == res.backend;
    if (!reached) {
      const std::string no = fiar::why_not(b, t);
      rejected += "; " + name + (no.empty() ? " passed by: " + fiar::why_auto_skips(b, t) : " cannot run: " + no);
    }
    return false;
  });
  return order + rejected;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  fiar::Backend requested = fiar::Backend::Auto;
  std::string requested_from = "default";
  fiar::DiscoveryReport report;
  fiar_cli::CommandLine cli("fiar-check", kUsage);
  add_options(cli, opt);
  const auto status = cli.parse(argc, argv, [&] {
    if (opt.backend) {
      requested = fiar::parse_backend(*opt.backend);
      requested_from = "--backend";
    } else {
      requested = fiar::backend_from_env();
      if (requested != fiar::Backend::Auto) requested_from = fiar::backend_env_var;
    }
    if (opt.describes_topology()) report.topology = described_topology(opt);
  });
  if (status) return *status;
  if (opt.strategy_table) {
    print_strategy_table();
    return kExitValid;
  }

  if (!opt.describes_topology()) {
    try {
      fiar::TopologyOverrides overrides;
      overrides.interconnect = opt.interconnect;
      report = discovered_topology(overrides);
    } catch (const std::exception& e) {
      std::string what = e.what();
      if (what.rfind("fiar: ", 0) == 0) what.erase(0, 6);  // one prefix: the tool's
      fiar_cli::print_error("fiar-check", "topology discovery failed: " + what);
      return kExitDiscoveryFailed;
    }
  }
  const fiar::Topology& t = report.topology;

  std::printf("fiar-check %s\n", fiar::version_string);
  std::printf(
      "topology (%s):\n  %s\n",
      opt.describes_topology()
          ? "described by flags"
          : ("discovered: " + std::to_string(t.world_size) + " in-process rank(s), one per visible GPU").c_str(),
      fiar::to_string(t).c_str());
  for (const auto& n : report.notes) std::printf("  note: %s\n", n.c_str());
  std::printf("requested backend: %s (%s)\n", std::string(fiar::to_string(requested)).c_str(), requested_from.c_str());
  std::printf("backends on this topology:\n");
  fiar::find_first(fiar::BackendPolicies{}, [&](auto p) {
    const fiar::Backend b = decltype(p)::type::backend;
    const std::string why = fiar::why_not(b, t);
    const std::string slow = fiar::why_auto_skips(b, t);
    std::printf("  %-7s %s\n", std::string(fiar::to_string(b)).c_str(),
                !why.empty()   ? ("cannot run: " + why).c_str()
                : slow.empty() ? "can run"
                               : ("can run, but " + slow).c_str());
    return false;
  });
  if (const int v = fiar::nccl_version(); v > 0) {
    std::printf(
        "nccl on GPUs: NCCL %d.%d.%d, %s\n", v / 10000, v / 100 % 100, v % 100,
        fiar::nccl_symmetric_available()
            ? "symmetric windows (ncclAllReduce on NCCL's symmetric kernels; FIAR_NCCL_SYMMETRIC=0 turns them off)"
            : "classic ncclAllReduce (symmetric windows need NCCL 2.27 or newer)");
  } else {
    std::printf("nccl on GPUs: not in this build (fiar was built without NCCL)\n");
  }
  try {
    const fiar::Resolution res = fiar::resolve_backend(requested, t);
    std::printf("choice: %s\n  why: %s\n", std::string(fiar::to_string(res.backend)).c_str(),
                why_chosen(requested, res, t).c_str());
    std::printf("  strategy table: %s\n", strategy_row_text(res.backend, t).c_str());
    if (const std::string cost = fiar::expected_cost(res.backend, t); !cost.empty()) {
      std::printf("  warning: %s\n", cost.c_str());
    }
    if (res.allow_trtllm_fallback) {
      std::printf("  fallback: if multicast setup fails on this machine, trtllm is used instead (one node)\n");
    }
    return kExitValid;
  } catch (const std::invalid_argument& e) {
    std::printf("choice: REJECTED (the reason and its fix are on stderr)\n");
    std::fflush(stdout);
    fiar_cli::print_error("fiar-check", e.what());
    return kExitRejected;
  }
}
