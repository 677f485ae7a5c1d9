// SPDX-License-Identifier: Apache-2.0
// The consumer's one nvcc translation unit: the launches it needs (float, the plain all-reduce), as docs/api.md says.
#define FIAR_INSTANTIATE_DTYPES(X, ...) X(__VA_ARGS__, float)
#define FIAR_INSTANTIATE_PATTERNS(X, ...) X(__VA_ARGS__, AllReduce)
#include <fiar/instantiate.cuh>
