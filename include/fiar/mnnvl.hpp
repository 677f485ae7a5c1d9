// fiar/mnnvl.hpp — Workspace<MnnvlPolicy, T, Platform>: the NVLink-multicast backend.
// Contract: as detail::LamportWorkspace (collective verified creation, validated calls, bounded waits);
// each rank's region is bound to one multicast object of the group, so a value every rank needs is one
// multicast store (one-shot push, two-shot broadcast); the two-shot scatter uses the peer mappings.
// Creation throws fiar::multicast_error on every rank alike when the machine cannot set multicast up.
#pragma once

#include "detail/lamport_workspace.hpp"
#include "policy.hpp"
#include "workspace.hpp"

namespace fiar::inline v0_1 {

/// The mnnvl backend: the Lamport protocols over NVLink multicast (NVSwitch; across nodes with fabric
/// handles, e.g. GB200 NVL72 with IMEX). World sizes 1 to 64.
template <ReduceType T, class Platform>
class Workspace<MnnvlPolicy, T, Platform> : public detail::LamportWorkspace<MnnvlPolicy, T, Platform> {
 public:
  using detail::LamportWorkspace<MnnvlPolicy, T, Platform>::LamportWorkspace;
};

}  // namespace fiar::inline v0_1
