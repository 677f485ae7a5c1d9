// SPDX-License-Identifier: Apache-2.0
// trtllm on a node whose ranks cannot map each other's memory.
// expect: backend_needs_peer_access
#include <fiar/fiar.hpp>
#ifdef FIAR_EXPECT_OK
constexpr bool kPeers = true;
#else
constexpr bool kPeers = false;
#endif
constexpr auto kChoice =
    fiar::resolve_backend(fiar::Backend::Trtllm, fiar::Topology{.world_size = 8, .node_peer_access = kPeers});
