// SPDX-License-Identifier: Apache-2.0
// The trtllm backend with one process per rank: CudaPlatform maps the peers' workspaces with CUDA IPC.
// This test is the parent: it creates the shared-memory segment the ranks meet in, starts one gpu-ipc-rank
// process per rank with posix_spawn (not fork: CUDA is already initialised here), waits for them within a
// bound, and requires each to exit 0 (every result bit-exact; see ipc_rank.cpp). Processes on one GPU use
// IPC too, so this runs on a single-GPU machine. Meson passes the rank executable in FIAR_GPU_IPC_RANK.
#include <cuda_runtime_api.h>
#include <spawn.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../common/shm_bootstrap.hpp"
#include "gpu_support.hpp"

extern char** environ;

using namespace std::chrono_literals;

namespace {

std::string rank_executable() {
  const char* path = std::getenv("FIAR_GPU_IPC_RANK");
  return path != nullptr ? path : "";
}

// A temporary file a child writes its stdout and stderr to; removed when destroyed.
struct LogFile {
  std::string path;
  int fd = -1;
  LogFile() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fiar-gpu-ipc-XXXXXX").string();
    fd = ::mkstemp(pattern.data());
    if (fd < 0) throw std::runtime_error("mkstemp: " + std::string(std::strerror(errno)));
    path = pattern;
  }
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;
  ~LogFile() {
    ::close(fd);
    ::unlink(path.c_str());
  }
  [[nodiscard]] std::string text() const {
    std::ifstream in(path);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
};

// Children that are killed and reaped if the test leaves early (a failed REQUIRE, an exception).
struct Children {
  std::vector<pid_t> pids;
  Children() = default;
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;
  ~Children() {
    if (!pids.empty()) (void)fiar_test::wait_children(pids, 0ms);
  }
};

struct GroupResult {
  std::vector<int> status;  ///< wait status per rank
  std::vector<std::string> logs;
  std::chrono::steady_clock::duration elapsed{};
};

// Runs one gpu-ipc-rank process per entry of `devices` (rank r on CUDA device devices[r]); returns once
// all have exited, or after `limit`, when the ones still running are killed.
GroupResult run_group(const std::vector<int>& devices, std::chrono::milliseconds limit = 120s) {
  const std::string exe = rank_executable();
  INFO("FIAR_GPU_IPC_RANK must name the gpu-ipc-rank executable (test/meson.build sets it)");
  REQUIRE(!exe.empty());
  const int world = static_cast<int>(devices.size());
  fiar_test::ShmSegment segment(fiar_test::unique_shm_name("gpu-ipc"), world);
  std::deque<LogFile> logs(devices.size());
  Children children;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args = {exe,
                                     "--shm",
                                     segment.name(),
                                     "--rank",
                                     std::to_string(r),
                                     "--world",
                                     std::to_string(world),
                                     "--device",
                                     std::to_string(devices[static_cast<std::size_t>(r)])};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, logs[static_cast<std::size_t>(r)].fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, logs[static_cast<std::size_t>(r)].fd, STDERR_FILENO);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    INFO("posix_spawn of " << exe << " for rank " << r << ": " << std::strerror(rc));
    REQUIRE(rc == 0);
    children.pids.push_back(pid);
  }
  GroupResult result;
  result.status = fiar_test::wait_children(children.pids, limit);
  children.pids.clear();
  result.elapsed = std::chrono::steady_clock::now() - start;
  for (const auto& log : logs) {
    result.logs.push_back(log.text());
    std::fputs(result.logs.back().c_str(), stdout);  // the ranks' summaries, in the test log
  }
  std::fflush(stdout);
  return result;
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

void require_all_passed(const GroupResult& result, const std::vector<int>& devices) {
  for (std::size_t r = 0; r < result.status.size(); ++r) {
    INFO("rank " << r << " on device " << devices[r] << ": " << fiar_test::describe_wait_status(result.status[r])
                 << "; its output:\n"
                 << result.logs[r]);
    REQUIRE(exit_code(result.status[r]) == 0);
  }
}

// Several processes on one GPU need the default compute mode (or MPS, which this test cannot see):
// "" when the device is in it, else why the same-GPU cases cannot run.
std::string why_gpu_not_shared(int device) {
  int mode = cudaComputeModeDefault;
  if (const cudaError_t e = cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, device); e != cudaSuccess) {
    (void)cudaGetLastError();
    return "cannot read the compute mode of GPU " + std::to_string(device) + ": " + cudaGetErrorName(e);
  }
  if (mode == cudaComputeModeDefault) return "";
  return "GPU " + std::to_string(device) + " is not in the default compute mode (mode " + std::to_string(mode) +
         "): several processes cannot share it";
}

}  // namespace

TEST_CASE("one process per rank, all on one GPU: peers mapped with CUDA IPC, results bit-exact", "[gpu][ipc]") {
  if (const std::string why = why_gpu_not_shared(0); !why.empty()) {
    WARN(why);
    return;
  }
  const int world = GENERATE(2, 4);
  const std::vector<int> devices = fiar_test::ranks_on_gpu(world);
  CAPTURE(world);
  require_all_passed(run_group(devices), devices);
}

TEST_CASE("one process per GPU: peers mapped with CUDA IPC across GPUs, results bit-exact", "[gpu][ipc][multi_gpu]") {
  const std::vector<int> devices =
      fiar_test::gpus_with_peer_access(fiar_test::kShmMaxRanks, "one process per GPU needs");
  if (devices.empty()) return;
  const int n = static_cast<int>(devices.size());
  CAPTURE(n);
  require_all_passed(run_group(devices), devices);
}

TEST_CASE("a rank whose device does not exist fails every rank promptly, not at a timeout", "[gpu][ipc]") {
  const std::vector<int> devices = {0, fiar_test::device_count() + 7};
  const GroupResult result = run_group(devices);
  for (std::size_t r = 0; r < devices.size(); ++r) {
    INFO("rank " << r << ": " << fiar_test::describe_wait_status(result.status[r]) << "; its output:\n"
                 << result.logs[r]);
    CHECK(exit_code(result.status[r]) == 1);
  }
  CHECK(result.logs[0].find("rank 1 could not select its device") != std::string::npos);
  CHECK(result.logs[1].find("cudaSetDevice(" + std::to_string(devices[1]) + ") failed") != std::string::npos);
  CHECK(result.elapsed < 30s);  // well under the ranks' 60 s bootstrap bound
}
