// SPDX-License-Identifier: Apache-2.0
// The one kernel of the GPU tests that is not fiar's: plain multimem stores through a multicast mapping, to check
// CudaPlatform::allocate_multicast apart from fiar's protocols (test_gpu_mnnvl.cpp).
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace {
// Stores salt + i into word i of every member's memory through the group's multicast mapping.
__global__ void multicast_store_kernel(std::uint32_t* mc, int words, std::uint32_t salt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int i = static_cast<int>(threadIdx.x + blockIdx.x * blockDim.x); i < words;
       i += static_cast<int>(blockDim.x * gridDim.x)) {
    asm volatile("multimem.st.relaxed.sys.global.b32 [%0], %1;" ::"l"(mc + i), "r"(salt + static_cast<std::uint32_t>(i))
                 : "memory");
  }
#endif
}

}  // namespace

void multicast_store(std::uint32_t* mc, int words, std::uint32_t salt) {
  multicast_store_kernel<<<64, 256>>>(mc, words, salt);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("multicast_store launch: ") + cudaGetErrorString(e));
}
