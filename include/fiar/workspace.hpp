// fiar/workspace.hpp — the all-reduce workspace of one backend and one element type.
// Contract: Workspace<P, T> exists only for an AllreducePolicy P and a ReduceType T; naming it with
// anything else is a compile error that names the unmet concept.
#pragma once

#include "dtype.hpp"
#include "policy.hpp"
#include "version.hpp"

namespace fiar::inline v0_1 {

/// The per-group buffers and protocol state of backend P for element type T (defined by the backend
/// headers; this declaration carries the constraints).
template <AllreducePolicy P, ReduceType T>
class Workspace;

}  // namespace fiar::inline v0_1
