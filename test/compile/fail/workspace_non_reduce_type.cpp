// SPDX-License-Identifier: Apache-2.0
// Workspace<TrtllmPolicy, int>: int is not a ReduceType.
// expect-g++: satisfaction of .ReduceType<T>. \[with T = int\]
// expect-nvcc: constraint failed for "int"(.|\n)*ReduceType
#include <fiar/fiar.hpp>
#ifdef FIAR_EXPECT_OK
fiar::Workspace<fiar::TrtllmPolicy, __half>* declared = nullptr;
#else
fiar::Workspace<fiar::TrtllmPolicy, int>* declared = nullptr;
#endif
