// SPDX-License-Identifier: Apache-2.0
// Example 4 — the backend chosen at compile time from a constant topology: a deployment that always runs on the same
// kind of machine names it once, and the compiler picks the policy (and rejects one that cannot run there).
//
//   build/examples/04_compile_time
//
// It always runs on the host emulator, which plays the constant topology (multicast included), GPUs or not. A program
// built this way for real GPUs checks at startup that the machine is the one it was built for: fiar::check_topology
// on fiar::discover_topology(boot) throws std::invalid_argument, naming the rule, before any collective allocation;
// here the same check runs on the constant, and on a two-node topology it refuses. Public API only.
#include <fiar/fiar.hpp>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

// The machine this build is for: 4 ranks on one node with NVSwitch multicast, sm_90 (an HGX H100/H200 slice).
constexpr fiar::Topology kMachine = [] {
  fiar::Topology t;
  t.world_size = 4;
  t.node_count = 1;
  t.multicast_supported = true;
  t.arch = 90;
  return t;
}();

// Auto's choice, made by the compiler: mnnvl (multicast) on this machine.
using Policy = fiar::policy_for_t<kMachine>;
static_assert(std::is_same_v<Policy, fiar::MnnvlPolicy>);

// What the compiler refuses: trtllm on two nodes. Uncomment to see the error name the rule.
//   constexpr fiar::Topology kTwoNodes = [] { auto t = kMachine; t.world_size = 8; t.node_count = 2; return t; }();
//   static_assert((fiar::check_topology<fiar::TrtllmPolicy>(kTwoNodes), true));
constexpr bool kTrtllmRunsHere = fiar::can_run_on(fiar::Backend::Trtllm, kMachine);
static_assert(kTrtllmRunsHere, "on one node, trtllm is the alternative to mnnvl");

constexpr int kTokens = 3;
constexpr int kHidden = 512;
constexpr std::size_t kCount = static_cast<std::size_t>(kTokens) * kHidden;

long run_rank(fiar::InProcessBootstrap& boot) {
  fiar::Topology topo = kMachine;
  topo.rank = boot.rank();
  // The compile-time policy's rules, applied to this rank's view of the machine (here the constant itself; a GPU
  // program passes fiar::discover_topology(boot) and stops with a clear message on the wrong machine).
  fiar::check_topology<Policy>(topo);
  fiar::WorkspaceConfig cfg;
  cfg.max_token_num = kTokens;
  cfg.hidden_dim = kHidden;
  fiar::Workspace<Policy, float, fiar::HostPlatform> ws(boot, topo, cfg);

  std::vector<float> in(kCount), out(kCount);
  for (std::size_t i = 0; i < kCount; ++i) in[i] = static_cast<float>(boot.rank()) + 0.25f * static_cast<float>(i % 8);
  ws.allreduce(in.data(), out.data(), kTokens);
  ws.check();
  long wrong = 0;
  for (std::size_t i = 0; i < kCount; ++i) {
    // 0 + 1 + 2 + 3 plus four times the same quarter-step: exact in float.
    if (out[i] != 6.0f + 4 * 0.25f * static_cast<float>(i % 8)) ++wrong;
  }
  return wrong;
}

}  // namespace

int main() {
  fiar::InProcessGroup group(kMachine.world_size);
  std::vector<long> wrong(kMachine.world_size, 0);
  std::vector<std::string> errors(kMachine.world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < kMachine.world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto boot = group.bootstrap(r);
        wrong[static_cast<std::size_t>(r)] = run_rank(boot);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  bool ok = true;
  for (int r = 0; r < kMachine.world_size; ++r) {
    if (!errors[static_cast<std::size_t>(r)].empty())
      std::fprintf(stderr, "rank %d: %s\n", r, errors[static_cast<std::size_t>(r)].c_str());
    ok = ok && errors[static_cast<std::size_t>(r)].empty() && wrong[static_cast<std::size_t>(r)] == 0;
  }
  // The wrong machine is refused at run time too, before anything is allocated:
  fiar::Topology two_nodes = kMachine;
  two_nodes.world_size = 8;
  two_nodes.node_count = 2;
  try {
    fiar::check_topology<fiar::TrtllmPolicy>(two_nodes);
    ok = false;
  } catch (const std::invalid_argument& e) {
    std::printf("trtllm on 2 nodes is refused: %.*s...\n", 90, e.what());
  }
  std::printf("04_compile_time: %s: backend %s chosen at compile time for %s\n", ok ? "PASS" : "FAIL",
              std::string(fiar::to_string(Policy::backend)).c_str(), fiar::to_string(kMachine).c_str());
  return ok ? 0 : 1;
}
