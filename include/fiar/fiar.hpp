// SPDX-License-Identifier: Apache-2.0
// fiar/fiar.hpp — the one header users include.
// Contract: includes every host-safe public header, one block per layer, bottom up; compiles in a plain g++ -std=c++20
// translation unit given the CUDA include directories (<cuda>/include and <cuda>/include/cccl).
#pragma once

#include "core/backend.hpp"
#include "core/config.hpp"
#include "core/dtype.hpp"
#include "core/errors.hpp"
#include "core/log.hpp"
#include "core/pattern.hpp"
#include "core/policy.hpp"
#include "core/resolve.hpp"
#include "core/strategy.hpp"
#include "core/topology.hpp"
#include "core/type_list.hpp"
#include "core/version.hpp"

#include "runtime/cuda.hpp"
#include "runtime/nccl.hpp"

#include "comm/agree.hpp"
#include "comm/bootstrap.hpp"
#include "comm/discover.hpp"
#include "comm/nccl_bootstrap.hpp"
#include "comm/tcp_bootstrap.hpp"

#include "exec/context.hpp"
#include "exec/host.hpp"
#include "exec/operation.hpp"

#include "algo/contexts.hpp"
#include "algo/convert.hpp"
#include "algo/epilogue.hpp"
#include "algo/epilogue_pass.hpp"
#include "algo/lamport.hpp"
#include "algo/multimem.hpp"
#include "algo/quant.hpp"
#include "algo/user_epilogue.hpp"

#include "platform/concept.hpp"
#include "platform/cuda.hpp"
#include "platform/host.hpp"

#include "backend/any.hpp"
#include "backend/pool.hpp"
#include "backend/registry.hpp"
#include "backend/workspace.hpp"
