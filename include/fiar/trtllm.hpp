// fiar/trtllm.hpp — Workspace<TrtllmPolicy, T, Platform>: the single-node peer-mapped backend.
// Contract: as detail::LamportWorkspace (collective verified creation, validated calls, bounded waits);
// every rank of one node maps every other rank's region and pushes with one unicast store per rank.
#pragma once

#include "detail/lamport_workspace.hpp"
#include "policy.hpp"
#include "workspace.hpp"

namespace fiar::inline v0_1 {

/// The trtllm backend: every rank of one node maps every other rank's buffers and runs the Lamport
/// one-shot or two-shot protocol over them. World sizes 1 to 16 (1 copies the input).
template <ReduceType T, class Platform>
class Workspace<TrtllmPolicy, T, Platform> : public detail::LamportWorkspace<TrtllmPolicy, T, Platform> {
 public:
  using detail::LamportWorkspace<TrtllmPolicy, T, Platform>::LamportWorkspace;
};

}  // namespace fiar::inline v0_1
