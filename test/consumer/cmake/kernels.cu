// SPDX-License-Identifier: Apache-2.0
// The consumer's one nvcc translation unit, with a subset of the launches as docs/api.md describes (one element type,
// one pattern, one operation: every subset macro used); main.cpp runs on the host emulator, which needs none of them.
#define FIAR_INSTANTIATE_DTYPES(X, ...) X(__VA_ARGS__, float)
#define FIAR_INSTANTIATE_PATTERNS(X, ...) X(__VA_ARGS__, AllReduce)
#define FIAR_INSTANTIATE_OPERATIONS(X) X(TrtllmOneShot)
#include <fiar/instantiate.cuh>
