// SPDX-License-Identifier: Apache-2.0
// Workspace<TrtllmPolicy, float, int>: int is not a Platform (it has none of what a workspace needs of one).
// expect-g++: satisfaction of .Platform<Pf>. \[with Pf = int\]
// expect-nvcc: constraint failed for "int"(.|\n)*Platform
#include <fiar/fiar.hpp>
#ifdef FIAR_EXPECT_OK
fiar::Workspace<fiar::TrtllmPolicy, float, fiar::HostPlatform>* declared = nullptr;
#else
fiar::Workspace<fiar::TrtllmPolicy, float, int>* declared = nullptr;
#endif
