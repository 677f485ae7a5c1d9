// SPDX-License-Identifier: Apache-2.0
// Collective topology discovery: node counting, capability votes, peer access, overrides, no-GPU behaviour.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using fiar::DiscoveryReport;
using fiar::LocalDevice;
using fiar::TopologyOverrides;

namespace {

struct RankOutcome {
  DiscoveryReport report;
  std::string error;
};

// Runs discovery on one thread per rank with the LocalDevice and overrides each rank is given.
std::vector<RankOutcome> discover_all(const std::vector<LocalDevice>& devices,
                                      std::function<TopologyOverrides(int)> overrides = {}) {
  fiar::InProcessGroup group(static_cast<int>(devices.size()), 20s);
  std::vector<RankOutcome> out(devices.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      auto boot = group.bootstrap(r);
      try {
        out[static_cast<std::size_t>(r)].report = fiar::discover_topology_report(
            boot, devices[static_cast<std::size_t>(r)], overrides ? overrides(r) : TopologyOverrides{});
      } catch (const std::exception& e) {
        out[static_cast<std::size_t>(r)].error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// A healthy H100/GB200-like GPU on node `node`, with a distinct bus id per rank.
LocalDevice gpu(const std::string& node, int index, bool multicast = true, bool fabric = true, int arch = 90) {
  LocalDevice d;
  d.usable = true;
  d.device = index;
  d.arch = arch;
  d.multicast = multicast;
  d.fabric_handles = fabric;
  d.pci_bus_id = "0000:" + std::to_string(16 + index) + ":00.0";
  d.node_id = node;
  return d;
}

LocalDevice no_gpu(const std::string& node) {
  LocalDevice d;
  d.node_id = node;
  d.error = "no usable CUDA device (cudaErrorNoDevice: no CUDA-capable device is detected)";
  return d;
}

// Every rank succeeded and holds the same topology except its own rank.
void require_consistent(const std::vector<RankOutcome>& out) {
  for (std::size_t r = 0; r < out.size(); ++r) {
    CAPTURE(r, out[r].error);
    REQUIRE(out[r].error.empty());
    CHECK(out[r].report.topology.rank == static_cast<int>(r));
    fiar::Topology a = out[r].report.topology, b = out[0].report.topology;
    a.rank = b.rank = 0;
    CHECK(a == b);
  }
}

bool any_note_contains(const DiscoveryReport& rep, const std::string& text) {
  for (const auto& n : rep.notes) {
    if (n.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("one node of eight multicast GPUs", "[discover]") {
  std::vector<LocalDevice> devs;
  for (int i = 0; i < 8; ++i) devs.push_back(gpu("nodeA", i, true, false));
  const auto out = discover_all(devs);
  require_consistent(out);
  const auto& t = out[0].report.topology;
  CHECK(t.world_size == 8);
  CHECK(t.node_count == 1);
  CHECK(t.multicast_supported);
  CHECK_FALSE(t.fabric_handles_supported);
  CHECK(t.node_peer_access);
  CHECK(t.arch == 90);
  CHECK(fiar::resolve_backend(fiar::Backend::Auto, t) == fiar::Resolution{fiar::Backend::Mnnvl, true});
}

TEST_CASE("node count comes from this group's identities, interleaved or not", "[discover]") {
  const int nodes = GENERATE(1, 2, 4);
  std::vector<LocalDevice> devs;
  for (int i = 0; i < 8; ++i) devs.push_back(gpu("node" + std::to_string(i % nodes), i / nodes));
  const auto out = discover_all(devs);
  require_consistent(out);
  CHECK(out[0].report.topology.node_count == nodes);
  for (int r = 0; r < 8; ++r) CHECK(out[0].report.node_of_rank[static_cast<std::size_t>(r)] == r % nodes);
}

TEST_CASE("multicast and fabric handles are voted: one rank without them removes them for all", "[discover]") {
  std::vector<LocalDevice> devs;
  for (int i = 0; i < 4; ++i) devs.push_back(gpu("nodeA", i));
  const int odd_rank = GENERATE(0, 3);
  SECTION("multicast") {
    devs[static_cast<std::size_t>(odd_rank)].multicast = false;
    const auto out = discover_all(devs);
    require_consistent(out);
    CHECK_FALSE(out[0].report.topology.multicast_supported);
    CHECK(out[0].report.topology.fabric_handles_supported);
    // All ranks still make the same choice.
    for (const auto& o : out)
      CHECK(fiar::resolve_backend(fiar::Backend::Auto, o.report.topology).backend == fiar::Backend::Trtllm);
  }
  SECTION("fabric handles") {
    devs[static_cast<std::size_t>(odd_rank)].fabric_handles = false;
    const auto out = discover_all(devs);
    require_consistent(out);
    CHECK(out[0].report.topology.multicast_supported);  // one node: multicast needs no fabric handles
    CHECK_FALSE(out[0].report.topology.fabric_handles_supported);
  }
}

TEST_CASE("multicast across nodes needs fabric handles on every rank", "[discover]") {
  std::vector<LocalDevice> devs;
  for (int i = 0; i < 8; ++i) devs.push_back(gpu(i < 4 ? "tray0" : "tray1", i % 4));
  SECTION("with fabric handles (NVL72-like)") {
    const auto out = discover_all(devs);
    require_consistent(out);
    CHECK(out[0].report.topology.node_count == 2);
    CHECK(out[0].report.topology.multicast_supported);
    CHECK(fiar::resolve_backend(fiar::Backend::Auto, out[0].report.topology) ==
          fiar::Resolution{fiar::Backend::Mnnvl, false});
  }
  SECTION("one rank without fabric handles") {
    devs[5].fabric_handles = false;
    const auto out = discover_all(devs);
    require_consistent(out);
    CHECK_FALSE(out[0].report.topology.multicast_supported);
    CHECK(any_note_contains(out[0].report, "not every rank supports fabric handles"));
    CHECK(fiar::resolve_backend(fiar::Backend::Auto, out[0].report.topology).backend == fiar::Backend::Nccl);
  }
}

TEST_CASE("peer access: one pair that cannot map each other disables it for the whole group", "[discover]") {
  std::vector<LocalDevice> devs;
  for (int i = 0; i < 4; ++i) devs.push_back(gpu("nodeA", i, false, false));
  const std::string blocked = devs[2].pci_bus_id;
  devs[1].can_map_peer = [blocked](const std::string& bus) { return bus != blocked; };
  const auto out = discover_all(devs);
  require_consistent(out);
  CHECK_FALSE(out[0].report.topology.node_peer_access);
  CHECK(any_note_contains(out[1].report, "cannot map the memory of rank 2"));
  CHECK(fiar::resolve_backend(fiar::Backend::Auto, out[0].report.topology).backend == fiar::Backend::Nccl);
}

TEST_CASE("peer access is only checked between ranks of the same node", "[discover]") {
  std::vector<LocalDevice> devs = {gpu("a", 0, false), gpu("a", 1, false), gpu("b", 0, false), gpu("b", 1, false)};
  std::vector<std::string> asked;
  std::mutex m;
  for (auto& d : devs) {
    d.can_map_peer = [&](const std::string& bus) {
      std::lock_guard lock(m);
      asked.push_back(bus);
      return true;
    };
  }
  const auto out = discover_all(devs);
  require_consistent(out);
  CHECK(out[0].report.topology.node_peer_access);
  CHECK(asked.size() == 4);  // each rank asked about its one same-node peer
}

TEST_CASE("several ranks on one GPU share it without a peer-access query", "[discover]") {
  std::vector<LocalDevice> devs = {gpu("a", 0, false), gpu("a", 0, false), gpu("a", 0, false)};
  for (auto& d : devs) d.can_map_peer = [](const std::string&) { return false; };
  const auto out = discover_all(devs);
  require_consistent(out);
  CHECK(out[0].report.topology.node_peer_access);
  CHECK(fiar::resolve_backend(fiar::Backend::Auto, out[0].report.topology).backend == fiar::Backend::Trtllm);
}

TEST_CASE("a rank without a usable device removes every capability and says why", "[discover]") {
  std::vector<LocalDevice> devs = {gpu("a", 0), gpu("a", 1), no_gpu("a"), gpu("a", 3)};
  const auto out = discover_all(devs);
  require_consistent(out);
  const auto& t = out[0].report.topology;
  CHECK_FALSE(t.multicast_supported);
  CHECK_FALSE(t.fabric_handles_supported);
  CHECK_FALSE(t.node_peer_access);
  CHECK(t.arch == 90);  // the lowest known architecture
  CHECK(any_note_contains(out[0].report, "ranks without a usable CUDA device: 2"));
  CHECK(any_note_contains(out[2].report, "no usable CUDA device (cudaErrorNoDevice"));
}

TEST_CASE("arch is the lowest among the ranks", "[discover]") {
  std::vector<LocalDevice> devs = {gpu("a", 0, true, true, 100), gpu("a", 1, true, true, 90),
                                   gpu("a", 2, true, true, 103)};
  const auto out = discover_all(devs);
  require_consistent(out);
  CHECK(out[0].report.topology.arch == 90);
}

TEST_CASE("overrides replace discovered values and are noted", "[discover]") {
  std::vector<LocalDevice> devs;
  for (int i = 0; i < 4; ++i) devs.push_back(gpu("a", i, false, false));
  const auto out = discover_all(devs, [](int) {
    TopologyOverrides o;
    o.node_count = 2;
    o.multicast_supported = true;
    o.fabric_handles_supported = true;
    o.node_peer_access = false;
    o.arch = 100;
    return o;
  });
  require_consistent(out);
  const auto& t = out[0].report.topology;
  CHECK(t.node_count == 2);
  CHECK(t.multicast_supported);
  CHECK(t.fabric_handles_supported);
  CHECK_FALSE(t.node_peer_access);
  CHECK(t.arch == 100);
  CHECK(any_note_contains(out[0].report, "node_count overridden by the caller: 2 (discovered 1)"));
  CHECK(any_note_contains(out[0].report, "multicast_supported overridden by the caller: yes (discovered no)"));
}

TEST_CASE("a node_id override groups ranks into nodes", "[discover]") {
  std::vector<LocalDevice> devs;
  for (int i = 0; i < 6; ++i) devs.push_back(gpu("same-host", i));
  const auto out = discover_all(devs, [](int r) {
    TopologyOverrides o;
    o.node_id = r < 3 ? "container-a" : "container-b";
    return o;
  });
  require_consistent(out);
  CHECK(out[0].report.topology.node_count == 2);
}

TEST_CASE("ranks with different overrides all throw the same kind of error", "[discover]") {
  std::vector<LocalDevice> devs;
  for (int i = 0; i < 3; ++i) devs.push_back(gpu("a", i));
  const auto out = discover_all(devs, [](int r) {
    TopologyOverrides o;
    if (r == 1) o.multicast_supported = false;
    return o;
  });
  for (const auto& o : out) {
    CHECK(o.error.find("ranks disagree about the topology") != std::string::npos);
    CHECK(o.error.find("rank 1 has") != std::string::npos);
  }
}

TEST_CASE("an override that makes the topology malformed is rejected on every rank", "[discover]") {
  std::vector<LocalDevice> devs = {gpu("a", 0), gpu("a", 1)};
  const auto out = discover_all(devs, [](int) {
    TopologyOverrides o;
    o.node_count = 3;
    return o;
  });
  for (const auto& o : out) CHECK(o.error.find("node_count = 3") != std::string::npos);
}

TEST_CASE("a malformed override on some ranks only: every rank throws, none waits for the others", "[discover]") {
  std::vector<LocalDevice> devs = {gpu("a", 0), gpu("a", 1), gpu("a", 2)};
  const auto out = discover_all(devs, [](int r) {
    TopologyOverrides o;
    if (r == 2) o.node_count = 5;
    return o;
  });
  for (const auto& o : out) CHECK(o.error.find("ranks disagree about the topology") != std::string::npos);
}

TEST_CASE("default_node_id: FIAR_NODE_ID wins, long ids are hashed, one process is one node", "[discover]") {
  const std::string automatic = fiar::default_node_id();
  CHECK_FALSE(automatic.empty());
  CHECK(automatic.size() <= fiar::max_node_id_length);
  ::setenv(fiar::node_id_env_var, " rack7-tray3\n", 1);
  CHECK(fiar::default_node_id() == "rack7-tray3");
  const std::string long_id(300, 'x');
  ::setenv(fiar::node_id_env_var, long_id.c_str(), 1);
  const std::string hashed = fiar::default_node_id();
  CHECK(hashed.rfind("hash:", 0) == 0);
  CHECK(hashed.size() <= fiar::max_node_id_length);
  ::unsetenv(fiar::node_id_env_var);
  CHECK(fiar::default_node_id() == automatic);
}

TEST_CASE("discovery with the real probe returns a topology, with or without a GPU", "[discover]") {
  int devices = 0;
  const bool have_gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  (void)cudaGetLastError();
  fiar::InProcessGroup group(2, 20s);
  std::vector<DiscoveryReport> reports(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto boot = group.bootstrap(r);
      reports[static_cast<std::size_t>(r)] = fiar::discover_topology_report(boot);
    });
  }
  for (auto& t : threads) t.join();
  const auto& t = reports[0].topology;
  CHECK(t.world_size == 2);
  CHECK(t.node_count == 1);  // two threads of one process are on one node
  if (!have_gpu) {
    CHECK_FALSE(t.multicast_supported);
    CHECK_FALSE(t.fabric_handles_supported);
    CHECK_FALSE(t.node_peer_access);
    CHECK(t.arch == 0);
    CHECK(any_note_contains(reports[0], "no usable CUDA device ("));
    CHECK(fiar::resolve_backend(fiar::Backend::Auto, t).backend == fiar::Backend::Nccl);
  } else {
    CHECK(t.arch >= 75);
  }
}
