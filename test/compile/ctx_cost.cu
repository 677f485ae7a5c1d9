// SPDX-License-Identifier: Apache-2.0
// Resource check of every fiar kernel (scripts/ctx-cost): every operation x pattern x element type, built from algo/
// through exec::kernel<Op> and DeviceCtx, the same instantiation header a program uses; next to it, the plain
// one-shot protocol written directly against threadIdx/blockIdx (no digest, no clusters, one poll in flight), for
// scale. ptxas -v must report no stack and no spills for any fiar kernel.
#include <cuda/atomic>
#include <cuda/ptx>

// Every fiar kernel: every operation, pattern and element type.
#include <fiar/instantiate.cuh>

namespace hand {

using fiar::algo::LamportParams;
using fiar::exec::Vec16;
using Atomic = cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>;

__device__ __forceinline__ Vec16 load_volatile(const std::uint32_t* p) {
  Vec16 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(__cvta_generic_to_global(p))
               : "memory");
  return v;
}

__device__ __forceinline__ void store_volatile(std::uint32_t* p, Vec16 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(__cvta_generic_to_global(p)), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// The one-shot protocol of algo::lamport_oneshot as it was before call digests, clusters and batched polls, written
// out by hand: push, clear, poll + reduce, finish.
template <fiar::ReduceType T>
__global__ void __launch_bounds__(1024) oneshot(const __grid_constant__ LamportParams<T> p) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  constexpr std::uint32_t kSentinel = fiar::exec::kSentinelWord;
  const std::uint64_t deadline = cuda::ptx::get_sreg_globaltimer() + p.timeout_ns;
  const std::uint32_t call = Atomic(p.state->call).load(cuda::std::memory_order_acquire);
  const std::size_t cur = (call % 3) * p.buffer_words;
  const std::size_t prev = ((call + 2) % 3) * p.buffer_words;
  const std::size_t vecs = static_cast<std::size_t>(p.vecs_per_token);
  const int tid = static_cast<int>(threadIdx.x);
  const int bid = static_cast<int>(blockIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int nblocks = static_cast<int>(gridDim.x);

  for (int t = bid; t < p.epi.num_tokens; t += nblocks) {
    const Vec16* in = reinterpret_cast<const Vec16*>(p.epi.in) + static_cast<std::size_t>(t) * vecs;
    for (int v = tid; v < p.vecs_per_token; v += nthreads) {
      const Vec16 x = fiar::exec::sanitize<sizeof(T)>(in[v]);
      const std::size_t at = cur + ((static_cast<std::size_t>(p.rank) * p.epi.num_tokens + t) * vecs + v) * 4;
      for (int i = 0; i < p.world_size; ++i) store_volatile(p.buffers[(p.rank + 1 + i) % p.world_size] + at, x);
    }
  }

  const std::size_t dirty = Atomic(p.state->dirty_words[(call + 2) % 3]).load(cuda::std::memory_order_relaxed);
  for (std::size_t i = (static_cast<std::size_t>(bid) * nthreads + tid) * 4; i < dirty;
       i += static_cast<std::size_t>(nthreads) * nblocks * 4) {
    store_volatile(p.buffers[p.rank] + prev + i, Vec16{kSentinel, kSentinel, kSentinel, kSentinel});
  }
  __syncthreads();
  if (tid == 0) cuda::atomic_thread_fence(cuda::std::memory_order_seq_cst, cuda::thread_scope_system);

  for (int t = bid; t < p.epi.num_tokens; t += nblocks) {
    Vec16* out = reinterpret_cast<Vec16*>(p.epi.out) + static_cast<std::size_t>(t) * vecs;
    for (int v = tid; v < p.vecs_per_token; v += nthreads) {
      fiar::algo::FloatPack<T> acc{};
      for (int r = 0; r < p.world_size; ++r) {
        const std::uint32_t* src =
            p.buffers[p.rank] + cur + ((static_cast<std::size_t>(r) * p.epi.num_tokens + t) * vecs + v) * 4;
        Vec16 y = load_volatile(src);
        while (fiar::exec::has_sentinel(y)) {
          if (cuda::ptx::get_sreg_globaltimer() > deadline) {
            Atomic(p.error->missing[0]).fetch_or(1u << r, cuda::std::memory_order_relaxed);  // up to 32 ranks
            Atomic(p.error->call).store(call, cuda::std::memory_order_relaxed);
            Atomic(p.error->code).store(fiar::algo::kErrorTimeout, cuda::std::memory_order_release);
            break;
          }
          __nanosleep(32);
          y = load_volatile(src);
        }
        fiar::algo::unpack_add<T>(y, acc);
      }
      out[v] = fiar::exec::sanitize<sizeof(T)>(fiar::algo::pack<T>(acc));
    }
  }

  __syncthreads();
  if (tid == 0) {
    const std::uint32_t before = Atomic(p.state->arrived).fetch_add(1u, cuda::std::memory_order_acq_rel);
    if (before + 1 == static_cast<std::uint32_t>(nblocks)) {
      const std::size_t used = static_cast<std::size_t>(p.world_size) * p.epi.num_tokens * vecs * 4;
      Atomic(p.state->dirty_words[call % 3]).store(static_cast<std::uint32_t>(used), cuda::std::memory_order_relaxed);
      Atomic(p.state->arrived).store(0u, cuda::std::memory_order_relaxed);
      Atomic(p.state->call).store(call + 1, cuda::std::memory_order_release);
    }
  }
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

template __global__ void oneshot<float>(const __grid_constant__ LamportParams<float>);
template __global__ void oneshot<__half>(const __grid_constant__ LamportParams<__half>);
template __global__ void oneshot<__nv_bfloat16>(const __grid_constant__ LamportParams<__nv_bfloat16>);

}  // namespace hand
