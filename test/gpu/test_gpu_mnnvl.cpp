// SPDX-License-Identifier: Apache-2.0
// The mnnvl backend on real GPUs: every visible GPU with NVLink multicast is one rank (a thread of this process),
// the Lamport protocols run over one multicast object of the group, and every result is compared bit for bit with
// the host rank-order reference (test/common/reference.hpp); the fused ResidualRmsNorm goes through the shared
// fusion reference. On GPUs without multicast, creating the workspace must throw fiar::multicast_error on every
// rank alike.
//
// Three meson tests run this file's cases (in gpu-tests), each exiting 77 (SKIP) before Catch2 runs when the
// machine lacks what its tests need (FIAR_GPU_MNNVL_NEED): "multicast" ([multicast]) needs 2 or more GPUs with
// multicast, "one-multicast" ([multicast_one]) one, "no-multicast" ([no_multicast]) a GPU without it. Without the
// variable (a manual run) a test whose GPUs are missing warns and returns.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include "gpu_support.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../common/fusion_reference.hpp"
#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::Pattern;
using fiar::Strategy;

// Stores salt + i into word i of every member's memory through the group's multicast mapping (multicast_store.cu).
void multicast_store(std::uint32_t* mc, int words, std::uint32_t salt);

namespace {

using fiar_test::Stream;

template <class T>
using MnnvlWorkspace = fiar_test::GpuWorkspace<fiar::MnnvlPolicy, T>;

// The bootstrap bound of the mnnvl tests' ranks (the other GPU tests use fiar_test::kGpuBootstrapTimeout, 60 s).
constexpr std::chrono::milliseconds kBootstrapTimeout = 90s;

// fiar_test::on_ranks with kBootstrapTimeout.
template <class Body>
auto on_mnnvl_ranks(const std::vector<int>& devices, Body&& body) {
  return fiar_test::on_ranks(devices, std::forward<Body>(body), kBootstrapTimeout);
}

// Visible CUDA devices with (or without) CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, read through cudart's driver
// entry points (the binary does not link libcuda). Capped at MnnvlPolicy::max_world_size.
std::vector<int> devices_with_multicast(bool wanted) {
  const int n = fiar_test::device_count();
  std::vector<int> found;
  for (int d = 0; d < n && static_cast<int>(found.size()) < fiar::MnnvlPolicy::max_world_size; ++d) {
    int value = 0;
    const bool readable = fiar::detail::driver_attribute(d, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, value);
    if (readable && (value != 0) == wanted) found.push_back(d);
  }
  return found;
}

// Runs before Catch2 (like gpu_gate.cpp): the meson test that needs what this machine lacks is a SKIP, not a pass.
const int mnnvl_gate = [] {
  const char* need = std::getenv("FIAR_GPU_MNNVL_NEED");
  if (need == nullptr || *need == '\0') return 0;
  const std::string what(need);
  if (what == "multicast" || what == "one-multicast") {
    const std::size_t needed = what == "multicast" ? 2 : 1;
    const auto found = devices_with_multicast(true);
    if (found.size() < needed) {
      std::printf("SKIP: %zu GPU(s) with NVLink multicast visible; these mnnvl tests need %zu or more\n", found.size(),
                  needed);
      std::fflush(stdout);
      std::_Exit(77);
    }
  } else if (what == "no-multicast") {
    if (devices_with_multicast(false).empty()) {
      std::printf("SKIP: no GPU without NVLink multicast visible (the test of the error needs one)\n");
      std::fflush(stdout);
      std::_Exit(77);
    }
  } else {
    std::printf("FIAR_GPU_MNNVL_NEED = '%s'; allowed: multicast, one-multicast, no-multicast\n", need);
    std::fflush(stdout);
    std::_Exit(1);
  }
  return 0;
}();

// The multicast GPUs, or a warning and an empty list (manual runs on machines without them).
std::vector<int> multicast_ranks() {
  const auto devices = devices_with_multicast(true);
  if (devices.size() < 2) {
    WARN("only " << devices.size() << " GPU(s) with NVLink multicast visible: the mnnvl cases need 2 or more");
    return {};
  }
  return devices;
}

// CudaPlatform::allocate_multicast directly, `repeats` times (each platform released before the next): every rank's
// memory starts zeroed, rank 0's multicast stores land in every rank's memory, every rank sees every peer's memory
// through its peer mapping. Returns what each rank found wrong ("" = nothing).
std::vector<std::string> check_platform_region(const std::vector<int>& devices, int repeats) {
  constexpr int kWords = 1 << 16;
  return on_mnnvl_ranks(devices, [&](int rank, fiar::InProcessBootstrap& boot) {
    std::string bad;
    const int world = static_cast<int>(devices.size());
    for (int repeat = 0; repeat < repeats; ++repeat) {
      fiar::CudaPlatform platform;
      const fiar::MulticastRegion region = platform.allocate_multicast(boot, kWords * sizeof(std::uint32_t));
      if (region.peers.size() != devices.size() || region.view.address == nullptr || region.view.members != nullptr ||
          region.view.member_count != 0) {
        bad += "unexpected region shape; ";
      }
      std::vector<std::uint32_t> host(kWords, 1);
      GPU_CHECK(cudaMemcpy(host.data(), region.peers[static_cast<std::size_t>(rank)], kWords * sizeof(std::uint32_t),
                           cudaMemcpyDeviceToHost));
      if (std::count(host.begin(), host.end(), 0u) != kWords) bad += "own memory not zeroed; ";
      boot.barrier();  // every rank has read its zeros before rank 0 stores
      const std::uint32_t salt = 1000u * static_cast<std::uint32_t>(repeat + 1);
      if (rank == 0) {
        multicast_store(region.view.address, kWords, salt);
        GPU_CHECK(cudaDeviceSynchronize());
      }
      boot.barrier();
      for (int r = 0; r < world; ++r) {  // every member's memory, read through this rank's peer mapping
        GPU_CHECK(cudaMemcpy(host.data(), region.peers[static_cast<std::size_t>(r)], kWords * sizeof(std::uint32_t),
                             cudaMemcpyDeviceToHost));
        int off = 0;
        for (int i = 0; i < kWords; ++i)
          off += host[static_cast<std::size_t>(i)] != salt + static_cast<std::uint32_t>(i);
        if (off != 0)
          bad += "repeat " + std::to_string(repeat) + ": " + std::to_string(off) + " words of rank " +
                 std::to_string(r) + "'s memory missed the multicast store; ";
      }
      boot.barrier();  // nobody releases while a peer still reads
    }
    return bad;
  });
}

// A sequence of calls every rank makes in place, back to back, with one strategy (fiar_test::run_and_check_calls:
// every output bit for bit). Every rank passes the discovered topology: it must report multicast on these GPUs, or
// the workspace rejects the mnnvl backend with std::invalid_argument (which the test then reports).
template <class T>
void run_and_check(const std::vector<int>& devices, int hidden, const std::vector<int>& tokens, Strategy strategy) {
  INFO("mnnvl, " << devices.size() << " GPUs, " << fiar_test::dtype_label<T>() << ", hidden " << hidden << ", "
                 << fiar::to_string(strategy));
  fiar_test::CallPlan plan;
  plan.devices = devices;
  plan.hidden = hidden;
  plan.tokens = tokens;
  plan.strategies.assign(tokens.size(), strategy);
  fiar_test::run_and_check_calls<fiar::MnnvlPolicy, T>(plan, kBootstrapTimeout);
}

using fiar_test::hidden_dims;

// ResidualRmsNorm on every rank (fresh workspace per strategy), checked by the shared fusion reference.
template <class T>
void run_residual_rmsnorm(const std::vector<int>& devices, int hidden, int tokens, Strategy strategy) {
  const int world = static_cast<int>(devices.size());
  INFO("mnnvl ResidualRmsNorm, " << world << " GPUs, " << fiar_test::dtype_label<T>() << ", hidden " << hidden << ", "
                                 << tokens << " tokens, " << fiar::to_string(strategy));
  const auto got = on_mnnvl_ranks(devices, [&](int rank, fiar::InProcessBootstrap& boot) {
    Stream stream;  // allocations before the workspace: its creation ends with a barrier
    fiar_test::FusedBuffers<T> b(tokens, hidden, 0);
    b.set_constants(hidden, 1.0f, stream.s);
    MnnvlWorkspace<T> ws(boot, fiar::discover_topology(boot), fiar_test::one_shot_config(tokens, hidden));
    fiar_test::FusedResult<T> mine;
    fiar_test::finish_together(boot, [&] {
      mine = fiar_test::run_fused<Pattern::ResidualRmsNorm>(ws, b, stream.s, rank, hidden,
                                                            {.tokens = tokens, .strategy = strategy});
      if (!mine.rejection.empty()) throw std::runtime_error("unexpected rejection: " + mine.rejection);
    });
    return mine;
  });
  std::vector<fiar_test::Outputs<T>> outs;
  for (const auto& r : got) {
    CHECK(r.ran == strategy);
    outs.push_back(r.outputs);
  }
  fiar_test::check_pattern<Pattern::ResidualRmsNorm, T>(fiar_test::Shape{world, tokens, hidden}, outs, true,
                                                        fiar::ScaleLayout::Swizzled128x4, 0.0f, 1.0f);
}

// What each rank caught when creating an mnnvl workspace that must fail: the exception's type, text and status.
struct Caught {
  bool multicast_error = false;
  std::string what;
  int status = 0;
};

// Every rank creates an mnnvl workspace on `devices` with the discovered topology, except that it claims
// multicast (and sm_90, the backend's minimum), so the backend's topology check passes and the platform itself
// must find out; then all ranks pass one more barrier (nobody was left waiting inside the creation).
std::vector<Caught> create_expecting_failure(const std::vector<int>& devices) {
  return on_mnnvl_ranks(devices, [&](int, fiar::InProcessBootstrap& boot) {
    fiar::Topology topo = fiar::discover_topology(boot);
    topo.multicast_supported = true;
    topo.arch = std::max(topo.arch, 90);
    Caught mine;
    try {
      MnnvlWorkspace<__nv_bfloat16> ws(boot, topo, fiar_test::one_shot_config(8, 1024));
      mine.what = "(no exception)";
    } catch (const fiar::multicast_error& e) {
      mine.multicast_error = true;
      mine.what = e.what();
      mine.status = e.status();
    } catch (const std::exception& e) {
      mine.what = std::string("not a multicast_error: ") + e.what();
    }
    boot.barrier();
    return mine;
  });
}

// The first GPU with NVLink multicast (world-size-1 cases), or a warning and none.
std::optional<int> one_multicast_gpu() {
  const std::vector<int> devices = devices_with_multicast(true);
  if (devices.empty()) {
    WARN("no GPU with NVLink multicast visible");
    return std::nullopt;
  }
  return devices[0];
}

}  // namespace

TEMPLATE_TEST_CASE("mnnvl: every multicast GPU one rank; one-shot and two-shot are bit-exact on every rank",
                   "[gpu][multicast]", float, __half, __nv_bfloat16) {
  const std::vector<int> devices = multicast_ranks();
  if (devices.empty()) return;
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  const int hidden = GENERATE_COPY(from_range(hidden_dims<TestType>()));
  const int world = static_cast<int>(devices.size());
  run_and_check<TestType>(devices, hidden, {1, 3, 17, 64, 2, 33, world}, strategy);
}

TEST_CASE("mnnvl: Auto and mixed strategies keep the rotation consistent", "[gpu][multicast]") {
  const std::vector<int> devices = multicast_ranks();
  if (devices.empty()) return;
  run_and_check<__nv_bfloat16>(devices, 4096, {5, 64, 1, 12, 7, 40, 2, 9}, Strategy::Auto);
}

TEMPLATE_TEST_CASE("mnnvl: fused ResidualRmsNorm matches the reference", "[gpu][multicast]", float, __nv_bfloat16) {
  const std::vector<int> devices = multicast_ranks();
  if (devices.empty()) return;
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  const int tokens = GENERATE(3, 70);
  run_residual_rmsnorm<TestType>(devices, 2048, tokens, strategy);
}

TEST_CASE("allocate_multicast on every multicast GPU: zeroed, multicast stores reach every rank", "[gpu][multicast]") {
  const std::vector<int> devices = multicast_ranks();
  if (devices.empty()) return;
  const auto wrong = check_platform_region(devices, 3);
  for (std::size_t r = 0; r < wrong.size(); ++r) {
    CAPTURE(r, wrong[r]);
    CHECK(wrong[r].empty());
  }
}

TEST_CASE("allocate_multicast with world size 1, repeatedly (setup and release)", "[gpu][multicast_one]") {
  const std::optional<int> gpu = one_multicast_gpu();
  if (!gpu) return;
  const auto wrong = check_platform_region({*gpu}, 8);
  CAPTURE(wrong[0]);
  CHECK(wrong[0].empty());
}

TEMPLATE_TEST_CASE("mnnvl workspace with world size 1 on a multicast GPU", "[gpu][multicast_one]", float,
                   __nv_bfloat16) {
  const std::optional<int> gpu = one_multicast_gpu();
  if (!gpu) return;
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  run_and_check<TestType>({*gpu}, 2048, {1, 3, 17}, strategy);
}

TEST_CASE("mnnvl: two ranks on one multicast GPU fail with fiar::multicast_error on both", "[gpu][multicast_one]") {
  const std::optional<int> gpu = one_multicast_gpu();
  if (!gpu) return;
  const auto caught = create_expecting_failure({*gpu, *gpu});
  for (std::size_t r = 0; r < caught.size(); ++r) {
    CAPTURE(r, caught[r].what);
    CHECK(caught[r].multicast_error);
    CHECK(caught[r].what.find("one rank per GPU") != std::string::npos);
  }
}

TEST_CASE("mnnvl on a GPU without multicast: fiar::multicast_error on every rank alike", "[gpu][no_multicast]") {
  const std::vector<int> without = devices_with_multicast(false);
  if (without.empty()) {
    WARN("every visible GPU has NVLink multicast: the error case needs one without");
    return;
  }
  const int world = GENERATE(1, 2);
  const std::vector<int> devices = fiar_test::ranks_on_gpu(world, without[0]);
  const auto caught = create_expecting_failure(devices);
  for (std::size_t r = 0; r < caught.size(); ++r) {
    const Caught& c = caught[r];
    CAPTURE(world, r, c.what);
    CHECK(c.multicast_error);
    CHECK(c.status == static_cast<int>(CUDA_ERROR_NOT_SUPPORTED));
    CHECK(c.what.find("does not support NVLink multicast") != std::string::npos);
    CHECK(c.what.find("CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 0") != std::string::npos);
    CHECK(c.what.find("FIAR_ALLREDUCE_BACKEND=trtllm") != std::string::npos);
    // Rank 0's own failure is reported first; the others name it.
    if (r != 0) CHECK(c.what.find("failed on rank 0") != std::string::npos);
  }
}
