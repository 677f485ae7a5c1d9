// SPDX-License-Identifier: Apache-2.0
// A rank outside [0, world_size) is malformed, whatever the backend (here nccl, which accepts any shape).
// expect: malformed_topology
#include <fiar/fiar.hpp>
#ifdef FIAR_EXPECT_OK
constexpr int kRank = 3;
#else
constexpr int kRank = 4;
#endif
constexpr auto kChoice = fiar::resolve_backend(fiar::Backend::Nccl, fiar::Topology{.world_size = 4, .rank = kRank});
