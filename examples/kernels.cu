// SPDX-License-Identifier: Apache-2.0
// The one nvcc translation unit of the example programs (and of the test binaries that run on GPUs): it defines
// CudaPlatform::launch for every fiar operation, so every other file can be plain C++ that includes <fiar/fiar.hpp>.
// Your program needs one such file per linked module (executable or shared library); see docs/api.md.
#include <fiar/instantiate.cuh>

// The kernels of example 05's user epilogue (bf16, the dtype it runs in): a user epilogue's header and one
// FIAR_INSTANTIATE_EPILOGUE line per element type, in the module's nvcc translation unit.
#include "mhc_post_mix.hpp"
FIAR_INSTANTIATE_EPILOGUE(MhcPostMix, __nv_bfloat16)
