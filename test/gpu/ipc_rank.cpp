// SPDX-License-Identifier: Apache-2.0
// gpu-ipc-rank: one rank of the multi-process GPU test (test_gpu_ipc.cpp starts one process per rank).
// Ranks talk through a shared-memory ShmBootstrap, so CudaPlatform maps every peer's workspace with CUDA
// IPC (other processes), whether the peers share this GPU or not. For float, half and bf16 in turn it
// creates a trtllm workspace, runs a fixed sequence of calls mixing one-shot, two-shot and Auto, in place
// and out of place, and compares every result bit for bit with the host rank-order reference (every rank
// regenerates every rank's input). Exit 0: all correct; 1: a mismatch, an error, or bad arguments.
#include <fiar/fiar.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../common/reference.hpp"
#include "../common/shm_bootstrap.hpp"
#include "gpu_device.hpp"

using namespace std::chrono_literals;
using fiar::Strategy;
using fiar_test::DeviceBuffer;
using fiar_test::gpu_check;
using fiar_test::Stream;

namespace {

constexpr const char* kUsage =
    "usage: gpu-ipc-rank --shm NAME --rank R --world W --device D\n"
    "  Runs rank R of W of the multi-process trtllm test on CUDA device D; the ranks meet in the\n"
    "  POSIX shared-memory segment NAME, which the parent (gpu-ipc-tests) has created.\n"
    "  Exit status: 0 all results bit-exact, 1 otherwise.\n";

struct Args {
  std::string shm;
  int rank = -1;
  int world = -1;
  int device = -1;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int parse_int(std::string_view flag, std::string_view text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) {
    throw UsageError(std::string(flag) + " needs an integer, got '" + std::string(text) + "'");
  }
  return value;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) throw UsageError(std::string(flag) + (flag.starts_with("--") ? " needs a value" : ": unknown"));
    const std::string_view value = argv[++i];
    if (flag == "--shm") {
      a.shm = value;
    } else if (flag == "--rank") {
      a.rank = parse_int(flag, value);
    } else if (flag == "--world") {
      a.world = parse_int(flag, value);
    } else if (flag == "--device") {
      a.device = parse_int(flag, value);
    } else {
      throw UsageError("unknown argument '" + std::string(flag) + "'");
    }
  }
  if (a.shm.empty()) throw UsageError("--shm is required");
  if (a.world < 1 || a.world > fiar_test::kShmMaxRanks) {
    throw UsageError("--world must be 1 to " + std::to_string(fiar_test::kShmMaxRanks));
  }
  if (a.rank < 0 || a.rank >= a.world) throw UsageError("--rank must be 0 to world - 1");
  if (a.device < 0) throw UsageError("--device must be 0 or more");
  return a;
}

struct Call {
  int tokens;
  Strategy strategy;
  bool in_place;
};

constexpr int kHidden = 2048;
constexpr int kMaxTokens = 64;
// Auto switches to two-shot above this many tokens (unless tokens < world size).
constexpr int kAutoOneshotTokens = 16;

std::vector<Call> plan(int world) {
  return {{1, Strategy::OneShot, true},     {3, Strategy::TwoShot, false}, {17, Strategy::Auto, true},
          {64, Strategy::TwoShot, true},    {2, Strategy::Auto, false},    {33, Strategy::OneShot, false},
          {world, Strategy::TwoShot, true}, {64, Strategy::Auto, false},   {5, Strategy::OneShot, true},
          {64, Strategy::OneShot, false}};
}

// Runs the plan for T; returns the number of wrong elements (details on stderr).
template <class T>
std::size_t run_type(fiar_test::ShmBootstrap& boot, const fiar::Topology& topo, int& ranks_on_gpu) {
  const int rank = boot.rank();
  const int world = boot.size();
  const auto calls = plan(world);
  const std::size_t stride = static_cast<std::size_t>(kMaxTokens) * kHidden;
  const std::size_t total = stride * calls.size();
  const std::string label = fiar_test::dtype_label<T>();

  // Every rank's inputs (this rank's go to the GPU), and the expected sums.
  std::vector<T> mine(total);
  std::vector<std::vector<T>> expected(calls.size());
  for (std::size_t c = 0; c < calls.size(); ++c) {
    const std::size_t count = static_cast<std::size_t>(calls[c].tokens) * kHidden;
    std::vector<std::vector<T>> inputs;
    for (int r = 0; r < world; ++r) inputs.push_back(fiar_test::make_input<T>(count, r, static_cast<int>(c)));
    std::copy(inputs[static_cast<std::size_t>(rank)].begin(), inputs[static_cast<std::size_t>(rank)].end(),
              mine.begin() + static_cast<std::ptrdiff_t>(stride * c));
    expected[c] = fiar_test::rank_order_sum(inputs, count);
  }

  // Allocate before the workspace: its creation ends with a barrier, so no rank's kernel waits for a
  // peer that is still inside an allocation.
  Stream stream;
  DeviceBuffer<T> in(total), out(total);
  // On the rank's own (non-blocking) stream, and finished before any call: the legacy default stream
  // would not order these copies before the kernels.
  gpu_check(cudaMemcpyAsync(in.p, mine.data(), total * sizeof(T), cudaMemcpyHostToDevice, stream.s),
            "cudaMemcpyAsync (inputs)");
  gpu_check(cudaMemsetAsync(out.p, 0xff, total * sizeof(T), stream.s), "cudaMemsetAsync (outputs)");
  gpu_check(cudaStreamSynchronize(stream.s), "cudaStreamSynchronize (inputs)");

  fiar::WorkspaceConfig cfg;
  cfg.max_token_num = kMaxTokens;
  cfg.hidden_dim = kHidden;
  cfg.oneshot_at_max_tokens = true;
  cfg.oneshot_max_bytes = static_cast<std::size_t>(kAutoOneshotTokens) * kHidden * sizeof(T);
  cfg.timeout = 20s;
  std::size_t wrong = 0;
  {
    fiar::Workspace<fiar::TrtllmPolicy, T, fiar::CudaPlatform> ws(boot, topo, cfg);
    ranks_on_gpu = ws.platform().ranks_on_gpu();
    // Back to back with no synchronization in between: a fast rank runs ahead of a slow one.
    for (std::size_t c = 0; c < calls.size(); ++c) {
      T* src = in.p + stride * c;
      T* dst = calls[c].in_place ? src : out.p + stride * c;
      ws.allreduce(src, dst, calls[c].tokens, stream.s, calls[c].strategy);
    }
    std::vector<T> got_in(total), got_out(total);
    gpu_check(cudaMemcpyAsync(got_in.data(), in.p, total * sizeof(T), cudaMemcpyDeviceToHost, stream.s),
              "cudaMemcpyAsync (results)");
    gpu_check(cudaMemcpyAsync(got_out.data(), out.p, total * sizeof(T), cudaMemcpyDeviceToHost, stream.s),
              "cudaMemcpyAsync (results)");
    gpu_check(cudaStreamSynchronize(stream.s), "cudaStreamSynchronize");
    ws.check();

    for (std::size_t c = 0; c < calls.size(); ++c) {
      const auto& want = expected[c];
      const T* result = (calls[c].in_place ? got_in.data() : got_out.data()) + stride * c;
      std::size_t bad = 0, first = 0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (fiar_test::bits(result[i]) != fiar_test::bits(want[i]) && bad++ == 0) first = i;
      }
      if (bad != 0) {
        std::fprintf(stderr,
                     "rank %d, %s, call %zu (%d tokens, %s, %s): %zu wrong; first at element %zu: got bits 0x%x, "
                     "expected 0x%x\n",
                     rank, label.c_str(), c, calls[c].tokens, std::string(fiar::to_string(calls[c].strategy)).c_str(),
                     calls[c].in_place ? "in place" : "out of place", bad, first, fiar_test::bits(result[first]),
                     fiar_test::bits(want[first]));
      }
      wrong += bad;
      if (!calls[c].in_place &&  // out of place leaves the input alone
          std::memcmp(got_in.data() + stride * c, mine.data() + stride * c, want.size() * sizeof(T)) != 0) {
        std::fprintf(stderr, "rank %d, %s, call %zu: the out-of-place call modified its input\n", rank, label.c_str(),
                     c);
        ++wrong;
      }
    }
    boot.barrier();  // peers write into this rank's buffers: nobody frees them before everyone is done
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gpu-ipc-rank: %s\n%s", e.what(), kUsage);
    return 1;
  }

  const std::string who = "gpu-ipc-rank " + std::to_string(args.rank) + "/" + std::to_string(args.world);
  std::optional<fiar_test::ShmBootstrap> joined;  // outlives the try block: the handler abandons the group
  try {
    fiar_test::ShmBootstrap& boot = joined.emplace(args.shm, args.rank, args.world);

    // Select the device, then agree: a rank without it fails every rank now instead of a timeout later.
    const cudaError_t selected = cudaSetDevice(args.device);
    if (selected != cudaSuccess) (void)cudaGetLastError();
    const auto status = fiar::all_gather_value(boot, static_cast<int>(selected));
    if (selected != cudaSuccess) {
      throw std::runtime_error("cudaSetDevice(" + std::to_string(args.device) +
                               ") failed: " + fiar_test::cuda_error_text(selected));
    }
    for (int r = 0; r < args.world; ++r) {
      if (const auto e = static_cast<cudaError_t>(status[static_cast<std::size_t>(r)]); e != cudaSuccess) {
        throw std::runtime_error("rank " + std::to_string(r) +
                                 " could not select its device: " + fiar_test::cuda_error_text(e));
      }
    }

    const fiar::Topology topo = fiar::discover_topology(boot);
    int on_gpu = 0;
    std::string summary;
    std::size_t wrong = 0;
    auto one = [&](auto tag) {
      using T = decltype(tag);
      const std::size_t w = run_type<T>(boot, topo, on_gpu);
      summary += (summary.empty() ? "" : ", ") + fiar_test::dtype_label<T>() + (w == 0 ? " ok" : " WRONG");
      wrong += w;
    };
    one(float{});
    one(__half{});
    one(__nv_bfloat16{});
    std::printf(
        "%s on device %d (%d rank(s) of the group on this GPU, peers in other processes mapped with "
        "CUDA IPC): %zu calls per type, %s\n",
        who.c_str(), args.device, on_gpu, plan(args.world).size(), summary.c_str());
    std::fflush(stdout);
    return wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    if (joined) joined->abandon();  // peers waiting for this rank fail now, not at their timeout
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
    return 1;
  }
}
