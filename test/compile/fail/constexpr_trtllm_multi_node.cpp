// SPDX-License-Identifier: Apache-2.0
// trtllm on a two-node topology known at compile time.
// expect: backend_cannot_span_nodes
#include <fiar/fiar.hpp>
#ifdef FIAR_EXPECT_OK
constexpr fiar::Topology kTopo{.world_size = 16, .rank = 0, .node_count = 1, .multicast_supported = false};
#else
constexpr fiar::Topology kTopo{.world_size = 16, .rank = 0, .node_count = 2, .multicast_supported = false};
#endif
constexpr auto kChoice = fiar::resolve_backend(fiar::Backend::Trtllm, kTopo);
