// The mnnvl backend on real GPUs: every visible GPU with NVLink multicast is one rank (a thread of this process),
// the Lamport protocols run over one multicast object of the group, and every result is compared bit for bit with
// the host rank-order reference (test/common/reference.hpp); the fused ResidualRmsNorm goes through the shared
// fusion reference. On GPUs without multicast, creating the workspace must throw fiar::multicast_error on every
// rank alike.
//
// Three meson tests run this binary, each exiting 77 (SKIP) before Catch2 runs when the machine lacks what its
// tests need (FIAR_GPU_MNNVL_NEED): "multicast" ([multicast]) needs 2 or more GPUs with multicast, "one-multicast"
// ([multicast_one]) one, "no-multicast" ([no_multicast]) a GPU without it. Without the variable (a manual run) a
// test whose GPUs are missing warns and returns.
#include <catch2/catch.hpp>
#include <fiar/fiar.hpp>

#include "gpu_support.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../common/fusion_reference.hpp"
#include "../common/reference.hpp"

using namespace std::chrono_literals;
using fiar::Pattern;
using fiar::Strategy;

// Stores salt + i into word i of every member's memory through the group's multicast mapping (multicast_store.cu).
void multicast_store(std::uint32_t* mc, int words, std::uint32_t salt);

namespace {

using fiar_test::DeviceBuffer;
using fiar_test::require_no_errors;
using fiar_test::Stream;

template <class T>
using MnnvlWorkspace = fiar::Workspace<fiar::MnnvlPolicy, T, fiar::CudaPlatform>;

// Visible CUDA devices with (or without) CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, read through cudart's driver
// entry points (the binary does not link libcuda). Capped at MnnvlPolicy::max_world_size.
std::vector<int> devices_with_multicast(bool wanted) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
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

// fiar_test::run_ranks_on with the 90 s bootstrap bound of the mnnvl tests (the other GPU tests use its 60 s).
std::vector<std::string> run_ranks(const std::vector<int>& devices,
                                   const std::function<void(int, fiar::InProcessBootstrap&)>& body) {
  return fiar_test::run_ranks_on(devices, body, 90s);
}

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
  std::vector<std::string> wrong(devices.size());
  const auto errors = run_ranks(devices, [&](int rank, fiar::InProcessBootstrap& boot) {
    std::string& bad = wrong[static_cast<std::size_t>(rank)];
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
        for (int i = 0; i < kWords; ++i) off += host[static_cast<std::size_t>(i)] != salt + static_cast<std::uint32_t>(i);
        if (off != 0) bad += "repeat " + std::to_string(repeat) + ": " + std::to_string(off) + " words of rank " +
                             std::to_string(r) + "'s memory missed the multicast store; ";
      }
      boot.barrier();  // nobody releases while a peer still reads
    }
  });
  require_no_errors(errors);
  return wrong;
}

// The topology every rank passes: the discovered one. It must report multicast on these GPUs, or the workspace
// rejects the mnnvl backend with std::invalid_argument (which the test then reports).
fiar::WorkspaceConfig config(int max_tokens, int hidden) {
  fiar::WorkspaceConfig cfg;
  cfg.max_token_num = max_tokens;
  cfg.hidden_dim = hidden;
  cfg.oneshot_at_max_tokens = true;
  cfg.timeout = 20s;
  return cfg;
}

// A sequence of calls every rank makes in place, launched back to back on its stream (so a fast rank runs ahead
// and the buffer rotation is exercised), then synchronized once; every output checked bit for bit.
template <class T>
void run_and_check(const std::vector<int>& devices, int hidden, const std::vector<int>& tokens, Strategy strategy) {
  const int world = static_cast<int>(devices.size());
  const int calls = static_cast<int>(tokens.size());
  const int max_tokens = *std::max_element(tokens.begin(), tokens.end());
  const std::size_t stride = static_cast<std::size_t>(max_tokens) * hidden;
  INFO("mnnvl, " << world << " GPUs, " << fiar_test::dtype_label<T>() << ", hidden " << hidden << ", "
                 << fiar::to_string(strategy));

  std::vector<std::vector<std::vector<T>>> inputs(static_cast<std::size_t>(calls));  // [call][rank]
  std::vector<std::vector<T>> expected(static_cast<std::size_t>(calls));
  for (int c = 0; c < calls; ++c) {
    const std::size_t count = static_cast<std::size_t>(tokens[static_cast<std::size_t>(c)]) * hidden;
    for (int r = 0; r < world; ++r) inputs[static_cast<std::size_t>(c)].push_back(fiar_test::make_input<T>(count, r, c));
    expected[static_cast<std::size_t>(c)] = fiar_test::rank_order_sum(inputs[static_cast<std::size_t>(c)], count);
  }

  std::vector<std::vector<T>> outputs(static_cast<std::size_t>(world));
  const auto errors = run_ranks(devices, [&](int rank, fiar::InProcessBootstrap& boot) {
    Stream stream;  // allocations before the workspace: its creation ends with a barrier
    DeviceBuffer<T> data(stride * static_cast<std::size_t>(calls));
    for (int c = 0; c < calls; ++c) {
      const auto& in = inputs[static_cast<std::size_t>(c)][static_cast<std::size_t>(rank)];
      GPU_CHECK(cudaMemcpy(data.p + stride * static_cast<std::size_t>(c), in.data(), in.size() * sizeof(T),
                           cudaMemcpyHostToDevice));
    }
    MnnvlWorkspace<T> ws(boot, fiar::discover_topology(boot), config(max_tokens, hidden));
    std::string failure;
    try {
      for (int c = 0; c < calls; ++c) {
        T* region = data.p + stride * static_cast<std::size_t>(c);
        ws.allreduce(region, region, tokens[static_cast<std::size_t>(c)], stream.s, strategy);
      }
      auto& out = outputs[static_cast<std::size_t>(rank)];
      out.resize(stride * static_cast<std::size_t>(calls));
      GPU_CHECK(cudaStreamSynchronize(stream.s));
      GPU_CHECK(cudaMemcpy(out.data(), data.p, out.size() * sizeof(T), cudaMemcpyDeviceToHost));
      ws.check();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    boot.barrier();  // no rank frees its memory while a peer's kernel may still write into it
    if (!failure.empty()) throw std::runtime_error(failure);
  });
  require_no_errors(errors);

  for (int c = 0; c < calls; ++c) {
    const auto& want = expected[static_cast<std::size_t>(c)];
    for (int r = 0; r < world; ++r) {
      const T* got = outputs[static_cast<std::size_t>(r)].data() + stride * static_cast<std::size_t>(c);
      std::size_t mismatches = 0, first = want.size();
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (fiar_test::bits(got[i]) != fiar_test::bits(want[i]) && mismatches++ == 0) first = i;
      }
      const T* rank0 = outputs[0].data() + stride * static_cast<std::size_t>(c);
      CAPTURE(c, r, tokens[static_cast<std::size_t>(c)]);
      if (mismatches != 0) {
        INFO("first mismatch at element " << first << ": got bits 0x" << std::hex << fiar_test::bits(got[first])
                                          << ", expected 0x" << fiar_test::bits(want[first]));
        CHECK(mismatches == 0);
      }
      CHECK(std::memcmp(got, rank0, want.size() * sizeof(T)) == 0);
    }
  }
}

template <class T>
std::vector<int> hidden_dims() {
  const int per_vec = 16 / static_cast<int>(sizeof(T));
  return {40 * per_vec, 1536 * per_vec};  // a partial warp; lanes looping over a token
}

// ResidualRmsNorm on every rank (fresh workspace per strategy), checked by the shared fusion reference.
template <class T>
void run_residual_rmsnorm(const std::vector<int>& devices, int hidden, int tokens, Strategy strategy) {
  constexpr float kEps = 1e-5f;  // what check_pattern assumes
  const int world = static_cast<int>(devices.size());
  const std::size_t count = static_cast<std::size_t>(tokens) * hidden;
  INFO("mnnvl ResidualRmsNorm, " << world << " GPUs, " << fiar_test::dtype_label<T>() << ", hidden " << hidden
                                 << ", " << tokens << " tokens, " << fiar::to_string(strategy));
  std::vector<fiar_test::Outputs<T>> outs(static_cast<std::size_t>(world));
  std::vector<Strategy> ran(static_cast<std::size_t>(world), Strategy::Auto);
  const auto errors = run_ranks(devices, [&](int rank, fiar::InProcessBootstrap& boot) {
    Stream stream;
    DeviceBuffer<T> in(count), residual(count), residual_out(count), norm_out(count),
        gamma(static_cast<std::size_t>(hidden));
    const std::vector<T> h_in = fiar_test::make_input<T>(count, rank, 0, false);
    const std::vector<T> h_residual = fiar_test::residual_of<T>(count, 0);
    const std::vector<T> h_gamma = fiar_test::gamma_of<T>(hidden);
    GPU_CHECK(cudaMemcpy(in.p, h_in.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(residual.p, h_residual.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(gamma.p, h_gamma.data(), h_gamma.size() * sizeof(T), cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemset(residual_out.p, 0xff, count * sizeof(T)));  // NaN in every type: must be overwritten
    GPU_CHECK(cudaMemset(norm_out.p, 0xff, count * sizeof(T)));
    MnnvlWorkspace<T> ws(boot, fiar::discover_topology(boot), config(tokens, hidden));
    std::string failure;
    try {
      fiar::FusedArgs<T> a;
      a.in = in.p;
      a.num_tokens = tokens;
      a.residual_in = residual.p;
      a.residual_out = residual_out.p;
      a.gamma = gamma.p;
      a.eps = kEps;
      a.weight_bias = 0.0f;
      a.norm_out = norm_out.p;
      ws.template run<Pattern::ResidualRmsNorm>(a, stream.s, strategy);
      ran[static_cast<std::size_t>(rank)] = ws.last_strategy();
      GPU_CHECK(cudaStreamSynchronize(stream.s));
      auto& o = outs[static_cast<std::size_t>(rank)];
      o.residual_out.resize(count);
      o.norm_out.resize(count);
      GPU_CHECK(cudaMemcpy(o.residual_out.data(), residual_out.p, count * sizeof(T), cudaMemcpyDeviceToHost));
      GPU_CHECK(cudaMemcpy(o.norm_out.data(), norm_out.p, count * sizeof(T), cudaMemcpyDeviceToHost));
      ws.check();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    boot.barrier();
    if (!failure.empty()) throw std::runtime_error(failure);
  });
  require_no_errors(errors);
  for (int r = 0; r < world; ++r) CHECK(ran[static_cast<std::size_t>(r)] == strategy);
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
  std::vector<Caught> caught(devices.size());
  const auto errors = run_ranks(devices, [&](int rank, fiar::InProcessBootstrap& boot) {
    fiar::Topology topo = fiar::discover_topology(boot);
    topo.multicast_supported = true;
    topo.arch = std::max(topo.arch, 90);
    Caught& mine = caught[static_cast<std::size_t>(rank)];
    try {
      MnnvlWorkspace<__nv_bfloat16> ws(boot, topo, config(8, 1024));
      mine.what = "(no exception)";
    } catch (const fiar::multicast_error& e) {
      mine.multicast_error = true;
      mine.what = e.what();
      mine.status = e.status();
    } catch (const std::exception& e) {
      mine.what = std::string("not a multicast_error: ") + e.what();
    }
    boot.barrier();
  });
  require_no_errors(errors);
  return caught;
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
  const std::vector<int> devices = devices_with_multicast(true);
  if (devices.empty()) {
    WARN("no GPU with NVLink multicast visible");
    return;
  }
  const auto wrong = check_platform_region({devices[0]}, 8);
  CAPTURE(wrong[0]);
  CHECK(wrong[0].empty());
}

TEMPLATE_TEST_CASE("mnnvl workspace with world size 1 on a multicast GPU", "[gpu][multicast_one]", float,
                   __nv_bfloat16) {
  const std::vector<int> devices = devices_with_multicast(true);
  if (devices.empty()) {
    WARN("no GPU with NVLink multicast visible");
    return;
  }
  const Strategy strategy = GENERATE(Strategy::OneShot, Strategy::TwoShot);
  run_and_check<TestType>({devices[0]}, 2048, {1, 3, 17}, strategy);
}

TEST_CASE("mnnvl: two ranks on one multicast GPU fail with fiar::multicast_error on both", "[gpu][multicast_one]") {
  const std::vector<int> devices = devices_with_multicast(true);
  if (devices.empty()) {
    WARN("no GPU with NVLink multicast visible");
    return;
  }
  const auto caught = create_expecting_failure({devices[0], devices[0]});
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
  const std::vector<int> devices(static_cast<std::size_t>(world), without[0]);
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
