// SPDX-License-Identifier: Apache-2.0
// A Backend value cast from an integer outside the enumeration is rejected, not run as some backend.
// expect: backend_value_out_of_range
#include <fiar/fiar.hpp>
#ifdef FIAR_EXPECT_OK
constexpr auto kRequested = static_cast<fiar::Backend>(3);  // Nccl
#else
constexpr auto kRequested = static_cast<fiar::Backend>(7);
#endif
constexpr auto kChoice = fiar::resolve_backend(kRequested, fiar::Topology{.world_size = 2});
