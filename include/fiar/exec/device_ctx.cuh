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

  /// Every lane of the block; true on every lane when any lane passed true (one bar.red.or).
  __device__ static bool sync_or(bool vote) { return __syncthreads_or(vote ? 1 : 0) != 0; }

  /// Butterfly reductions over the 32 lanes of a warp: every lane gets the same bits (x + y == y + x).
  __device__ static float warp_sum(float x) {
    FIAR_UNROLL
    for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
  }
  __device__ static float warp_max(float x) {
    FIAR_UNROLL
    for (int m = 16; m > 0; m >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
    return x;
  }

  /// Block-wide sum and max (every lane of the block calls them; blockDim.x is a multiple of 32): each warp's
  /// butterfly, then the warps' results combined by a butterfly in every warp. A fixed tree for a given block size.
  __device__ static float sum(float x) { return block_reduce<false>(x); }
  __device__ static float max(float x) { return block_reduce<true>(x); }

  template <bool kMax>
  __device__ static float block_reduce(float x) {
    __shared__ float partial[32];
    const int warp = static_cast<int>(threadIdx.x) >> 5;
    const int sub = static_cast<int>(threadIdx.x) & 31;
    const float mine = kMax ? warp_max(x) : warp_sum(x);
    if (sub == 0) partial[warp] = mine;
    __syncthreads();
    const float y =
        sub < static_cast<int>(blockDim.x >> 5) ? partial[sub] : (kMax ? -__int_as_float(0x7f800000) : 0.0f);
    const float total = kMax ? warp_max(y) : warp_sum(y);
    __syncthreads();  // nobody overwrites `partial` before every lane has read it
    return total;
  }

  /// This block's rank in its thread-block cluster and the cluster's size (1 in a launch without clusters).
  __device__ static int cluster_rank() { return static_cast<int>(__clusterRelativeBlockRank()); }
  __device__ static int cluster_size() { return static_cast<int>(__clusterSizeInBlocks()); }

  /// This block's cluster in the grid, and the grid's clusters (%clusterid.x / %nclusterid.x: no division).
  __device__ static int cluster_index() { return static_cast<int>(__clusterIdx().x); }
  __device__ static int clusters() { return static_cast<int>(__clusterGridDimInClusters().x); }

  /// Every lane of every block of the cluster (barrier.cluster arrive.release / wait.acquire; a block barrier in a
  /// launch without clusters).
  __device__ static void cluster_sync() {
    if (__clusterSizeInBlocks() == 1) {
      __syncthreads();
    } else {
      __cluster_barrier_arrive();
      __cluster_barrier_wait();
    }
  }

  /// Cluster-wide sum and max: each block's own (block_reduce), then the blocks' results read from every block's shared
  /// memory (distributed shared memory) in cluster-rank order, so every block of the cluster gets the same bits.
  /// Every lane of every block of the cluster calls them.
  __device__ static float cluster_sum(float x) { return cluster_reduce<false>(x); }
  __device__ static float cluster_max(float x) { return cluster_reduce<true>(x); }

  template <bool kMax>
  __device__ static float cluster_reduce(float x) {
    const float mine = block_reduce<kMax>(x);
    const unsigned size = __clusterSizeInBlocks();
    if (size == 1) return mine;
    __shared__ float partial;
    if (threadIdx.x == 0) partial = mine;
    cluster_sync();
    float total = *static_cast<const float*>(__cluster_map_shared_rank(&partial, 0));
    for (unsigned b = 1; b < size; ++b) {
      const float other = *static_cast<const float*>(__cluster_map_shared_rank(&partial, b));
      total = kMax ? fmaxf(total, other) : total + other;
    }
    cluster_sync();  // no block overwrites its partial (or exits) before every block has read it
    return total;
  }

  /// A token's canonical sum (exec::canonical_token_sum): each warp calls token_sum_add once per chunk of 32
  /// consecutive vectors, lane i with vector chunk * 32 + i (q = 0 for a vector past the token's end); the warp's
  /// butterfly gives the chunk sum, which lanes 0 .. cluster_size - 1 store into that block's slot of the chunk (every
  /// block of the cluster holds every chunk sum). token_sum then gives every lane the canonical total.
  __device__ static float* token_slots() {
    __shared__ float slots[kMaxTokenChunks];
    return slots;
  }
  __device__ static void token_sum_add(int vec, float q) {
    const float chunk = warp_sum(q);
    const unsigned sub = threadIdx.x & 31u;
    const unsigned size = __clusterSizeInBlocks();
    float* slot = token_slots() + (vec >> 5);
    if (size == 1) {
      if (sub == 0) *slot = chunk;
    } else if (sub < size) {
      *static_cast<float*>(__cluster_map_shared_rank(slot, sub)) = chunk;
    }
  }
  __device__ static float token_sum(int vecs) {
    cluster_sync();  // every chunk sum of the token is in every block's slots
    const int chunks = (vecs + kTokenSumChunk - 1) / kTokenSumChunk;
    float partial = 0.0f;
    // Not unrolled: at most kMaxTokenChunks / 32 steps, one or two at decode sizes; unrolled it cost ~100 instructions.
    FIAR_NO_UNROLL
    for (int j = static_cast<int>(threadIdx.x & 31u); j < chunks; j += kTokenSumChunk) partial += token_slots()[j];
    const float total = warp_sum(partial);
    // No block overwrites its slots (next token) or exits before every lane has read them: the values are already in
    // registers, so a relaxed arrive suffices (no memory fence).
    if (__clusterSizeInBlocks() == 1) {
      __syncthreads();
    } else {
      __cluster_barrier_arrive_relaxed();
      __cluster_barrier_wait();
    }
    return total;
  }

  /// The largest value of a group of `group_vecs` consecutive vectors of a token, group_vecs a power of two up to 32:
  /// the lanes of a warp hold 32 consecutive vectors (the epilogue's loops advance a warp together, every lane of it
  /// calling group_max), so a group is a run of group_vecs lanes, reduced by a butterfly within the run. Nothing is
  /// recorded: group_max_add and group_max_sync are the emulator's (which has no warps) and cost nothing here.
  __device__ static void group_max_add(int, float) {}
  __device__ static void group_max_sync() {}
  __device__ static float group_max(int, float x, int group_vecs) {
    for (int m = 1; m < group_vecs; m <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
    return x;
  }

  /// Nanoseconds of the GPU's global timer, for deadlines (only differences matter).
  __device__ static std::uint64_t now_ns() {
    // cuda::ptx::get_sreg_globaltimer()'s one instruction, without <cuda/ptx>'s 1.4 s parse
    std::uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }

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
#if __CUDA_ARCH__ >= 900
    // cuda::ptx::multimem_red(sem_release, scope_sys, op_add, ...)'s one instruction, without <cuda/ptx>'s 1.4 s parse
    asm volatile("multimem.red.release.sys.global.add.u32 [%0], %1;"
                 :
                 : "l"(__cvta_generic_to_global(view.address + offset)), "r"(value)
                 : "memory");
#endif
  }
  /// fence.proxy.alias: orders this thread's unicast and multicast accesses to the same memory.
  __device__ static void fence_multicast() {
    // cuda::ptx::fence_proxy_alias()'s one instruction, without <cuda/ptx>'s 1.4 s parse
    asm volatile("fence.proxy.alias;" : : : "memory");
  }
  /// 16-byte plain store (st.global.v4, weak): only for clearing a buffer no rank reads or writes in this call; the
  /// kernel boundary (griddepcontrol.wait of this rank's next call, whose pushes peers must see before they write the
  /// buffer again) orders it.
  __device__ static void store16_weak(std::uint32_t* p, const Vec16& v) { *reinterpret_cast<Vec16*>(p) = v; }
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
