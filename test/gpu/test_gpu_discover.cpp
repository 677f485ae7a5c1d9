// SPDX-License-Identifier: Apache-2.0
// Discovery on real GPUs: one in-process rank per visible device (threads), checked against what the
// CUDA runtime and driver report directly.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include <vector>

#include "gpu_support.hpp"

namespace {

int device_count() {
  int n = 0;
  REQUIRE(cudaGetDeviceCount(&n) == cudaSuccess);
  return n;
}

// One in-process rank per entry of `devices` (rank r on CUDA device devices[r]): what each discovered.
std::vector<fiar::DiscoveryReport> discover_on_devices(const std::vector<int>& devices) {
  return fiar_test::on_ranks(devices,
                             [](int, fiar::InProcessBootstrap& boot) { return fiar::discover_topology_report(boot); });
}

}  // namespace

TEST_CASE("probe_local_device matches the runtime's device properties", "[gpu]") {
  for (int d = 0; d < device_count(); ++d) {
    REQUIRE(cudaSetDevice(d) == cudaSuccess);
    const fiar::LocalDevice local = fiar::probe_local_device();
    cudaDeviceProp prop{};
    REQUIRE(cudaGetDeviceProperties(&prop, d) == cudaSuccess);
    CHECK(local.usable);
    CHECK(local.device == d);
    CHECK(local.arch == prop.major * 10 + prop.minor);
    int mc = 0;
    REQUIRE(fiar::detail::driver_attribute(d, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, mc));
    CHECK(local.multicast == (mc != 0));
    int same = -1;
    REQUIRE(cudaDeviceGetByPCIBusId(&same, local.pci_bus_id.c_str()) == cudaSuccess);
    CHECK(same == d);
  }
}

TEST_CASE("all visible GPUs as in-process ranks: one node, consistent capabilities", "[gpu]") {
  const std::vector<int> devices = fiar_test::one_rank_per_gpu(device_count());
  const auto reports = discover_on_devices(devices);
  const fiar::Topology& t = reports[0].topology;
  CHECK(t.world_size == static_cast<int>(devices.size()));
  CHECK(t.node_count == 1);
  bool all_multicast = true;
  for (int d : devices) {
    int mc = 0;
    fiar::detail::driver_attribute(d, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, mc);
    all_multicast = all_multicast && mc != 0;
  }
  CHECK(t.multicast_supported == all_multicast);
  CHECK_NOTHROW(fiar::resolve_backend(fiar::Backend::Auto, t));
}

TEST_CASE("several ranks on one GPU can map each other's memory", "[gpu]") {
  const auto reports = discover_on_devices(fiar_test::ranks_on_gpu(4));
  CHECK(reports[0].topology.world_size == 4);
  CHECK(reports[0].topology.node_peer_access);
  CHECK(fiar::can_run_on(fiar::Backend::Trtllm, reports[0].topology) == (reports[0].topology.arch >= 90));
}
