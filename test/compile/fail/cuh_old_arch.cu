// SPDX-License-Identifier: Apache-2.0
// A consumer's nvcc translation unit built for nvcc's default architecture (sm_75): <fiar/fiar.cuh> refuses it with
// the -gencode fix, where an unchecked build would get kernels that cannot wait for the work before them.
// This case is compiled without fiar's -gencode flags (test/meson.build); its valid twin shows that the host part,
// <fiar/fiar.hpp>, still compiles with nvcc for any architecture.
// expect-nvcc: fiar: this translation unit compiles device code for an architecture older than sm_90(.|\n)*gencode
#ifdef FIAR_EXPECT_OK
#include <fiar/fiar.hpp>
#else
#include <fiar/fiar.cuh>
#endif
int consumer_main() { return fiar::version_major; }
