// SPDX-License-Identifier: Apache-2.0
// policy_for_t on a malformed compile-time topology (node_count larger than world_size).
// expect: malformed_topology
#include <fiar/fiar.hpp>
#ifdef FIAR_EXPECT_OK
using Policy = fiar::policy_for_t<fiar::Topology{.world_size = 2, .rank = 0, .node_count = 2}>;
static_assert(std::is_same_v<Policy, fiar::NcclPolicy>);
#else
using Policy = fiar::policy_for_t<fiar::Topology{.world_size = 2, .rank = 0, .node_count = 3}>;
#endif
