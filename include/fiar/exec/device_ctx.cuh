// SPDX-License-Identifier: Apache-2.0
// fiar/exec/device_ctx.cuh — DeviceCtx: the execution context the algo/ kernels get on the GPU.
// Contract: an empty struct of inline accessors over threadIdx/blockIdx, %globaltimer and 16-byte volatile
// accesses; it holds no state, so it costs no register and no local memory (scripts/ctx-cost checks it).
#pragma once

#if !defined(__CUDACC__)
#error "fiar/exec/device_ctx.cuh needs nvcc: include <fiar/fiar.hpp> in host-only translation units"
#endif

// fiar's device code uses Hopper features (griddepcontrol, multimem, %globaltimer at system scope): refuse an older
// target instead of building kernels that trap or that cannot wait for the work before them.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error \
    "fiar: this translation unit compiles device code for an architecture older than sm_90 (nvcc's default is sm_75), and fiar's kernels need sm_90 or newer. Fix: compile it with -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_100a,code=sm_100a (Meson: add fiar_dep.get_variable('cuda_gencode').split() to the project's cuda arguments; CMake: CUDA_ARCHITECTURES \"90a;100a\")."
#endif

#include <cooperative_groups.h>
#include <cub/warp/warp_reduce.cuh>
#include <cuda/functional>
#include <cuda/ptx>

#include <cstddef>
#include <cstdint>

#include "../core/prelude.hpp"
#include "atomics.hpp"
#include "context.hpp"
#include "vec.hpp"

FIAR_BEGIN_NAMESPACE
namespace exec {

/// What a kernel of algo/ sees of the GPU: the same operations HostCtx offers in the host emulator.
/// Flag words use the system-scope atomics it inherits (also fence_system()).
struct DeviceCtx : SystemAtomics {
  /// Position of this thread: lane in its block, block in the grid (a 1-D launch).
  __device__ static int lane() { return static_cast<int>(threadIdx.x); }
  __device__ static int lanes() { return static_cast<int>(blockDim.x); }
  __device__ static int block() { return static_cast<int>(blockIdx.x); }
  __device__ static int blocks() { return static_cast<int>(gridDim.x); }

  /// Every lane of the block.
  __device__ static void sync() { __syncthreads(); }

  /// Block-wide sum and max (every lane of the block calls them; blockDim.x is a multiple of 32): CUB warp
  /// reductions, then warp 0 combines the warps' results. A fixed tree: the same block size gives the same
  /// bits on every rank.
  __device__ static float sum(float x) { return reduce(x, ::cuda::std::plus<float>{}); }
  __device__ static float max(float x) { return reduce(x, ::cuda::maximum<float>{}); }

  template <class Op>
  __device__ static float reduce(float x, Op op) {
    using WarpReduce = cub::WarpReduce<float>;
    __shared__ typename WarpReduce::TempStorage storage[32];
    __shared__ float partial[32];
    __shared__ float result;
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const int warps = static_cast<int>(blockDim.x) / 32;
    const float mine = WarpReduce(storage[warp]).Reduce(x, op);
    if (lane == 0) partial[warp] = mine;
    __syncthreads();
    if (warp == 0) {
      const float all = WarpReduce(storage[0]).Reduce(lane < warps ? partial[lane] : partial[0], op, warps);
      if (lane == 0) result = all;
    }
    __syncthreads();
    const float total = result;
    __syncthreads();  // nobody overwrites `result` before every lane has read it
    return total;
  }

  /// This block's rank in its thread-block cluster and the cluster's size (1 in a launch without clusters).
  __device__ static int cluster_rank() { return static_cast<int>(cuda::ptx::get_sreg_cluster_ctarank()); }
  __device__ static int cluster_size() { return static_cast<int>(cuda::ptx::get_sreg_cluster_nctarank()); }

  /// Cluster-wide sum and max: each block's own (reduce()), then the blocks' results read from every block's shared
  /// memory (distributed shared memory) in cluster-rank order, so every block of the cluster gets the same bits.
  /// Every lane of every block of the cluster calls them.
  __device__ static float cluster_sum(float x) { return cluster_reduce(x, ::cuda::std::plus<float>{}); }
  __device__ static float cluster_max(float x) { return cluster_reduce(x, ::cuda::maximum<float>{}); }

  template <class Op>
  __device__ static float cluster_reduce(float x, Op op) {
    const float mine = reduce(x, op);
    const int size = cluster_size();
    if (size == 1) return mine;
    __shared__ float partial;
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    if (threadIdx.x == 0) partial = mine;
    cluster.sync();
    float total = *cluster.map_shared_rank(&partial, 0);
    for (int b = 1; b < size; ++b) total = op(total, *cluster.map_shared_rank(&partial, b));
    cluster.sync();  // no block overwrites its partial (or exits) before every block has read it
    return total;
  }

  /// Nanoseconds of the GPU's global timer, for deadlines (only differences matter).
  __device__ static std::uint64_t now_ns() { return cuda::ptx::get_sreg_globaltimer(); }

  /// Backs off a spinning lane for a moment (a hint of about 32 ns), leaving issue slots to its warp peers.
  __device__ static void pause() { __nanosleep(32); }

  /// 16-byte load of memory another rank writes concurrently: ONE ld.volatile.global.v4 (relaxed, system
  /// scope; each 32-bit word is single-copy atomic, which is all the Lamport protocol relies on). C++ has
  /// no spelling for it: a volatile uint4 is read member by member, four separate loads, so this is one
  /// of the few places fiar writes PTX itself (CCCL 3.0's cuda::ptx::ld has only weak forms).
  __device__ static Vec16 load16(const std::uint32_t* p) {
    Vec16 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(__cvta_generic_to_global(p))
                 : "memory");
    return v;
  }

  /// 16-byte store through the group's multicast mapping (mnnvl): ONE multimem.st.relaxed.sys.global.v4,
  /// which the NVSwitch replicates into every member's memory. Inline PTX because CCCL 3.0's
  /// cuda::ptx::multimem_st has only the scalar .b32 / .b64 forms; sm_90 or newer only (multimem does not
  /// exist before Hopper, and no fiar kernel is built for older GPUs).
  __device__ static void multicast_store16(const MulticastView& view, std::size_t offset, const Vec16& v) {
#if __CUDA_ARCH__ >= 900
    asm volatile("multimem.st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};"
                 :
                 : "l"(__cvta_generic_to_global(view.address + offset)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
#endif  // the #error at the top of this header refuses device code below sm_90
  }
  /// multimem.ld_reduce through the multicast mapping: the members' 16 bytes at `offset` summed by the NVSwitch
  /// (fp32 accumulation for the 16-bit types). Inline PTX: CCCL wraps only the integer forms.
  __device__ static Vec16 multicast_ld_reduce16(const MulticastView& view, std::size_t offset, ReduceKind kind) {
    Vec16 v{0, 0, 0, 0};
#if __CUDA_ARCH__ >= 900
    const auto at = __cvta_generic_to_global(view.address + offset);
    if (kind == ReduceKind::F32) {
      asm volatile("multimem.ld_reduce.relaxed.sys.global.add.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(at)
                   : "memory");
    } else if (kind == ReduceKind::F16) {
      asm volatile("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.f16x2 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(at)
                   : "memory");
    } else {
      asm volatile("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(at)
                   : "memory");
    }
#endif
    return v;
  }
  /// multimem.red.release.sys.global.add.u32: `value` added to the word at `offset` of every member.
  __device__ static void multicast_add_release(const MulticastView& view, std::size_t offset, std::uint32_t value) {
    cuda::ptx::multimem_red(cuda::ptx::sem_release, cuda::ptx::scope_sys, cuda::ptx::op_add, view.address + offset,
                            value);
  }
  /// fence.proxy.alias: orders this thread's unicast and multicast accesses to the same memory.
  __device__ static void fence_multicast() { cuda::ptx::fence_proxy_alias(); }
  /// 16-byte store to memory another rank reads concurrently: ONE st.volatile.global.v4.
  __device__ static void store16(std::uint32_t* p, const Vec16& v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :
                 : "l"(__cvta_generic_to_global(p)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  }
};

static_assert(ExecutionContext<DeviceCtx>);

}  // namespace exec
FIAR_END_NAMESPACE
