// SPDX-License-Identifier: Apache-2.0
// mnnvl without multicast support.
// expect: backend_needs_multicast
#include <fiar/fiar.hpp>
#ifdef FIAR_EXPECT_OK
constexpr bool kMulticast = true;
#else
constexpr bool kMulticast = false;
#endif
constexpr fiar::Topology kTopo{.world_size = 8, .rank = 0, .node_count = 1, .multicast_supported = kMulticast};
constexpr auto kChoice = fiar::resolve_backend(fiar::Backend::Mnnvl, kTopo);
