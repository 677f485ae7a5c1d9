// SPDX-License-Identifier: Apache-2.0
// The interconnect fact: discovery's vote (every pair of a node over NVLink, or one over PCIe), the override, the
// merge in make_workspace, and the rule it feeds: auto does not pick trtllm's all-to-all pushes on a PCIe-only node of
// more than 2 ranks; an explicit trtllm still runs there, with one warning naming the cost.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using fiar::Backend;
using fiar::Interconnect;
using fiar::Topology;

namespace {

Topology node(int world, Interconnect i, bool multicast = false) {
  Topology t;
  t.world_size = world;
  t.multicast_supported = multicast;
  t.arch = 90;
  t.interconnect = i;
  return t;
}

// GPU `index` of one node; its links to the other GPUs are NVLink except to those in `pcie_peers` (bus ids).
fiar::LocalDevice gpu(int index, std::vector<int> pcie_peers, bool nvml = true) {
  fiar::LocalDevice d;
  d.usable = true;
  d.device = index;
  d.arch = 90;
  d.pci_bus_id = "0000:" + std::to_string(16 + index) + ":00.0";
  d.node_id = "nodeA";
  if (nvml) {
    d.link_to_peer = [pcie_peers](const std::string& bus) {
      for (int p : pcie_peers) {
        if (bus == "0000:" + std::to_string(16 + p) + ":00.0") return Interconnect::Pcie;
      }
      return Interconnect::NvLink;
    };
  }
  return d;
}

std::vector<fiar::DiscoveryReport> discover(const std::vector<fiar::LocalDevice>& devices,
                                            fiar::TopologyOverrides overrides = {}) {
  fiar::InProcessGroup group(static_cast<int>(devices.size()), 20s);
  std::vector<fiar::DiscoveryReport> out(devices.size());
  std::vector<std::string> errors(devices.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        auto boot = group.bootstrap(r);
        out[static_cast<std::size_t>(r)] =
            fiar::discover_topology_report(boot, devices[static_cast<std::size_t>(r)], overrides);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) REQUIRE(e.empty());
  return out;
}

struct WarningCapture {
  std::mutex mutex;
  std::vector<std::string> warnings;
  fiar::LogSink previous;
  WarningCapture() {
    previous = fiar::set_log_sink([this](fiar::LogLevel level, std::string_view message) {
      std::lock_guard lock(mutex);
      if (level == fiar::LogLevel::Warning) warnings.emplace_back(message);
    });
  }
  ~WarningCapture() { fiar::set_log_sink(previous); }
};

}  // namespace

TEST_CASE("interconnect: auto passes trtllm by on a PCIe-only node of more than 2 ranks", "[interconnect]") {
  for (int world = 1; world <= 16; ++world) {
    CAPTURE(world);
    const auto pcie = fiar::resolve_backend(Backend::Auto, node(world, Interconnect::Pcie));
    CHECK(pcie.backend == (world <= 2 ? Backend::Trtllm : Backend::Nccl));
    CHECK(fiar::slow_on(Backend::Trtllm, node(world, Interconnect::Pcie)) == (world > 2));
    // NVLink and Unknown keep the rules without the fact.
    CHECK(fiar::resolve_backend(Backend::Auto, node(world, Interconnect::NvLink)).backend == Backend::Trtllm);
    CHECK(fiar::resolve_backend(Backend::Auto, node(world, Interconnect::Unknown)).backend == Backend::Trtllm);
    CHECK_FALSE(fiar::slow_on(Backend::Nccl, node(world, Interconnect::Pcie)));
  }
  // mnnvl keeps its fallback to trtllm only where trtllm would be picked.
  CHECK(fiar::resolve_backend(Backend::Auto, node(8, Interconnect::NvLink, true)) ==
        fiar::Resolution{Backend::Mnnvl, true});
  // At compile time too.
  static_assert(std::is_same_v<fiar::policy_for_t<Topology{
                                   .world_size = 4, .node_count = 1, .arch = 90, .interconnect = Interconnect::Pcie}>,
                               fiar::NcclPolicy>);
  static_assert(std::is_same_v<fiar::policy_for_t<Topology{
                                   .world_size = 2, .node_count = 1, .arch = 90, .interconnect = Interconnect::Pcie}>,
                               fiar::TrtllmPolicy>);
}

TEST_CASE("interconnect: an explicit trtllm on PCIe runs, and the reason auto would not is spelled out",
          "[interconnect]") {
  const Topology t = node(4, Interconnect::Pcie);
  CHECK(fiar::resolve_backend(Backend::Trtllm, t) == fiar::Resolution{Backend::Trtllm, false});
  CHECK(fiar::why_not(Backend::Trtllm, t).empty());  // it can run
  const std::string cost = fiar::expected_cost(Backend::Trtllm, t);
  CHECK(cost.find("PCIe-only node of 4 ranks") != std::string::npos);
  CHECK(cost.find("3 peers") != std::string::npos);
  CHECK(fiar::why_auto_skips(Backend::Trtllm, t).find("slower than nccl") != std::string::npos);
  CHECK(fiar::expected_cost(Backend::Trtllm, node(2, Interconnect::Pcie)).empty());
  CHECK(fiar::to_string(t).find(", interconnect pcie") != std::string::npos);
  CHECK(fiar::to_string(node(4, Interconnect::Unknown)).find("interconnect") == std::string::npos);
}

TEST_CASE("interconnect: make_workspace on the host emulator, auto and explicit, one warning for the group",
          "[interconnect]") {
  const int world = 4;
  for (Backend requested : {Backend::Auto, Backend::Trtllm}) {
    WarningCapture log;
    fiar::InProcessGroup group(world, 20s);
    std::vector<Backend> ran(world, Backend::Auto);
    std::vector<std::string> errors(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        try {
          auto boot = group.bootstrap(r);
          Topology t = node(world, Interconnect::Pcie);
          t.rank = r;
          fiar::WorkspaceConfig cfg;
          cfg.max_token_num = 2;
          cfg.hidden_dim = 64;
          auto ws = fiar::make_workspace<float, fiar::HostPlatform>(boot, t, cfg, requested,
                                                                    fiar::HostPlatformOptions{.blocks = 2, .lanes = 4});
          std::vector<float> in(128, static_cast<float>(r + 1)), out(128);
          ws.allreduce(in.data(), out.data(), 2);
          ws.check();
          if (out[0] != 10.0f || out[127] != 10.0f) errors[static_cast<std::size_t>(r)] = "wrong sum";
          ran[static_cast<std::size_t>(r)] = ws.backend();
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
    for (auto& th : threads) th.join();
    for (const auto& e : errors) CHECK(e.empty());
    const Backend want = requested == Backend::Auto ? Backend::Nccl : Backend::Trtllm;
    for (Backend b : ran) CHECK(b == want);
    if (requested == Backend::Auto) {
      CHECK(log.warnings.empty());
    } else {
      REQUIRE(log.warnings.size() == 1);
      CHECK(log.warnings[0].find("PCIe-only node of 4 ranks") != std::string::npos);
    }
  }
}

TEST_CASE("interconnect: one rank that says PCIe makes the group's choice PCIe's", "[interconnect]") {
  fiar::InProcessGroup group(3, 20s);
  std::vector<Topology> merged(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto boot = group.bootstrap(r);
      Topology t = node(3, r == 1 ? Interconnect::Pcie : Interconnect::NvLink);
      t.rank = r;
      auto ws = fiar::make_workspace<float, fiar::HostPlatform>(
          boot, t, fiar::WorkspaceConfig{.max_token_num = 1, .hidden_dim = 16}, Backend::Auto,
          fiar::HostPlatformOptions{.blocks = 1, .lanes = 2});
      merged[static_cast<std::size_t>(r)] = ws.topology();
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& t : merged) {
    CHECK(t.interconnect == Interconnect::Pcie);
  }
}

TEST_CASE("interconnect: discovery votes per pair of a node; overrides win", "[interconnect]") {
  SECTION("every pair over NVLink") {
    const auto out = discover({gpu(0, {}), gpu(1, {}), gpu(2, {}), gpu(3, {})});
    for (const auto& rep : out) CHECK(rep.topology.interconnect == Interconnect::NvLink);
  }
  SECTION("one pair over PCIe makes the node PCIe, and a note names the ranks") {
    const auto out = discover({gpu(0, {}), gpu(1, {}), gpu(2, {3}), gpu(3, {2})});
    for (const auto& rep : out) CHECK(rep.topology.interconnect == Interconnect::Pcie);
    bool noted = false;
    for (const auto& n : out[0].notes) noted = noted || n.find("PCIe only") != std::string::npos;
    CHECK(noted);
    CHECK(fiar::resolve_backend(Backend::Auto, out[0].topology).backend == Backend::Nccl);
  }
  SECTION("without NVML the interconnect is unknown, and the rules are today's") {
    const auto out = discover({gpu(0, {}, false), gpu(1, {}, false)});
    for (const auto& rep : out) CHECK(rep.topology.interconnect == Interconnect::Unknown);
  }
  SECTION("ranks sharing one GPU do not vote") {
    auto a = gpu(0, {}), b = gpu(0, {});
    const auto out = discover({a, b});
    for (const auto& rep : out) CHECK(rep.topology.interconnect == Interconnect::Unknown);
  }
  SECTION("the override replaces what was found, with a note") {
    fiar::TopologyOverrides o;
    o.interconnect = Interconnect::Pcie;
    const auto out = discover({gpu(0, {}), gpu(1, {}), gpu(2, {})}, o);
    for (const auto& rep : out) CHECK(rep.topology.interconnect == Interconnect::Pcie);
    bool noted = false;
    for (const auto& n : out[0].notes) noted = noted || n.find("interconnect overridden") != std::string::npos;
    CHECK(noted);
  }
}

TEST_CASE("interconnect: a value outside the enumeration is a malformed topology", "[interconnect]") {
  Topology t = node(2, static_cast<Interconnect>(7));
  CHECK_THROWS_WITH(fiar::validate_topology(t), Catch::Contains("interconnect = 7"));
}
