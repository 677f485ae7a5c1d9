// SPDX-License-Identifier: Apache-2.0
// Workspace<SomeNonPolicy, float>: only fiar's policies satisfy AllreducePolicy.
// expect-g++: satisfaction of .AllreducePolicy<P>. \[with P = SomeNonPolicy\]
// expect-nvcc: constraint failed for "SomeNonPolicy"(.|\n)*AllreducePolicy
#include <fiar/fiar.hpp>
struct SomeNonPolicy : fiar::NcclPolicy {};  // same facts, but not one of fiar's policies
#ifdef FIAR_EXPECT_OK
fiar::Workspace<fiar::NcclPolicy, float>* declared = nullptr;
#else
fiar::Workspace<SomeNonPolicy, float>* declared = nullptr;
#endif
