// SPDX-License-Identifier: Apache-2.0
// fiar/platform/region.hpp — what a platform's allocate_multicast returns, for either platform.
// Contract: `peers` holds every rank's region as mapped by this rank (rank order, unicast); `view` is the group's
// multicast mapping of the same memory (a store through it lands in every rank's region).
#pragma once

#include <cstdint>
#include <vector>

#include "../core/prelude.hpp"
#include "../exec/context.hpp"

FIAR_BEGIN_NAMESPACE

/// Every rank's region as mapped here (unicast, rank order), and the group's multicast mapping of the same memory.
struct MulticastRegion {
  std::vector<std::uint32_t*> peers;
  exec::MulticastView view;
};

namespace algo {
using fiar::MulticastRegion;  // its name in fiar::algo before the platform layer had its own folder
}

FIAR_END_NAMESPACE
