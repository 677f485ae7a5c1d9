// SPDX-License-Identifier: Apache-2.0
// A consumer's nvcc translation unit: it compiles only when the build hands it fiar's architectures (sm_90 or newer;
// nvcc's default, sm_75, stops at fiar's #error). It prints the configured architectures it was built for.
#include <fiar/fiar.cuh>

#include <cstdio>

int main() {
  const fiar::WorkspaceConfig cfg{.max_token_num = 4, .hidden_dim = 64};
  std::printf("consumer: fiar %s, hidden_dim %d\n", fiar::version_string, cfg.hidden_dim);
  return 0;
}
