// fiar/fiar.hpp — the one header users include.
// Contract: includes every host-safe public header; compiles in a plain g++ -std=c++20 translation unit
// given the CUDA include directories (<cuda>/include and <cuda>/include/cccl).
#pragma once

#include "backend.hpp"
#include "bootstrap.hpp"
#include "discover.hpp"
#include "dtype.hpp"
#include "errors.hpp"
#include "policy.hpp"
#include "resolve.hpp"
#include "topology.hpp"
#include "version.hpp"
#include "workspace.hpp"
#include "algo/host_emulator.hpp"
#include "algo/lamport.hpp"
#include "platform_host.hpp"
#include "trtllm.hpp"
#include "mnnvl.hpp"
#include "nccl.hpp"
#include "log.hpp"
#include "any_workspace.hpp"
#include "pool.hpp"
#include "platform_cuda.hpp"
