// SPDX-License-Identifier: Apache-2.0
// trtllm with a world size its kernels do not support, through check_topology.
// expect: backend_world_size_unsupported
#include <fiar/fiar.hpp>
#ifdef FIAR_EXPECT_OK
constexpr int kWorld = 16;
#else
constexpr int kWorld = 17;
#endif
consteval bool fits() {
  fiar::check_topology<fiar::TrtllmPolicy>(fiar::Topology{.world_size = kWorld});
  return true;
}
static_assert(fits());
