// SPDX-License-Identifier: Apache-2.0
// A g++ translation unit of the consumer: two ranks (threads) all-reduce on the host emulator and check the sum.
#include <fiar/fiar.hpp>

#include <cstdio>
#include <thread>
#include <vector>

int main() {
  const fiar::WorkspaceConfig cfg{.max_token_num = 2, .hidden_dim = 64};
  fiar::InProcessGroup group(2);
  std::vector<int> wrong(2, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto boot = group.bootstrap(r);
      const fiar::Topology topo{.world_size = 2, .rank = r, .node_count = 1};
      fiar::Workspace<fiar::TrtllmPolicy, float, fiar::HostPlatform> ws(boot, topo, cfg);
      std::vector<float> in(128, static_cast<float>(r + 1)), out(128);
      ws.allreduce(in.data(), out.data(), 2);
      wrong[static_cast<std::size_t>(r)] = 0;
      for (float x : out) wrong[static_cast<std::size_t>(r)] += x != 3.0f;
    });
  }
  for (auto& t : ranks) t.join();
  const bool ok = wrong[0] == 0 && wrong[1] == 0;
  std::printf("consumer: fiar %s (nccl %s), all-reduce %s\n", fiar::version_string,
              fiar::built_with_nccl ? "yes" : "no", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
