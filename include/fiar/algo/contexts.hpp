// SPDX-License-Identifier: Apache-2.0
// fiar/algo/contexts.hpp — the execution contexts and atomics under the names fiar::algo gave them before the exec
// layer had its own folder (docs/api.md lists both spellings).
// Contract: aliases only; the definitions are exec::HostCtx, exec::HostGrid and exec::SystemAtomics.
#pragma once

#include "../core/prelude.hpp"
#include "../exec/atomics.hpp"
#include "../exec/host.hpp"

FIAR_BEGIN_NAMESPACE
namespace algo {
using exec::HostCtx;
using exec::HostGrid;
using exec::SystemAtomics;
}  // namespace algo
FIAR_END_NAMESPACE
