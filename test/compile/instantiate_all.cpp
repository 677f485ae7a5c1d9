// SPDX-License-Identifier: Apache-2.0
// Compile suite: every public template instantiated (host code by g++, every kernel by nvcc for each configured
// architecture in examples/kernels.cu), plus the constant-expression checks. Running it confirms they link and behave.
#include <fiar/fiar.hpp>

#include <cstdio>
#include <tuple>

#include "static_checks.hpp"

// The rule of docs/api.md ("Which header in which translation unit"), exercised: this is a g++ translation unit
// (<fiar/fiar.hpp> only) that names every workspace on CudaPlatform, explicitly instantiated, and links because
// examples/kernels.cu (the one nvcc translation unit, <fiar/instantiate.cuh>) defines every launch, for every
// configured architecture. Explicit instantiation of the class emits its members (they are Workspace's own).
#define FIAR_INSTANTIATE_WORKSPACE(Policy, T)                                         \
  template class fiar::Workspace<fiar::Policy, T, fiar::CudaPlatform>;                \
  template fiar::Workspace<fiar::Policy, T, fiar::CudaPlatform>::Workspace(           \
      fiar::InProcessBootstrap&, const fiar::Topology&, const fiar::WorkspaceConfig&, \
      const fiar::CudaPlatformOptions&);
#define FIAR_INSTANTIATE_RUN(Policy, T, P)                                                   \
  template void fiar::Workspace<fiar::Policy, T, fiar::CudaPlatform>::run<fiar::Pattern::P>( \
      const fiar::FusedArgs<T>&, cudaStream_t, fiar::Strategy);
#define FIAR_INSTANTIATE_BACKEND(Policy, T) \
  FIAR_INSTANTIATE_WORKSPACE(Policy, T) FIAR_FOR_EACH_PATTERN(FIAR_INSTANTIATE_RUN, Policy, T)
FIAR_FOR_EACH_DTYPE(FIAR_INSTANTIATE_BACKEND, TrtllmPolicy)
FIAR_FOR_EACH_DTYPE(FIAR_INSTANTIATE_BACKEND, MnnvlPolicy)
FIAR_FOR_EACH_DTYPE(FIAR_INSTANTIATE_BACKEND, NcclPolicy)
// The nccl workspace's second constructor adopts a communicator (it compiles in a build without NCCL too: its
// creation then throws).
#define FIAR_INSTANTIATE_NCCL_ADOPT(Unused, T)                                                        \
  template fiar::Workspace<fiar::NcclPolicy, T, fiar::CudaPlatform>::Workspace(                       \
      fiar::InProcessBootstrap&, fiar::NcclComm, const fiar::Topology&, const fiar::WorkspaceConfig&, \
      const fiar::CudaPlatformOptions&);
FIAR_FOR_EACH_DTYPE(FIAR_INSTANTIATE_NCCL_ADOPT, )
template std::vector<std::uint32_t*> fiar::CudaPlatform::allocate_shared(fiar::InProcessBootstrap&, std::size_t);
template fiar::MulticastRegion fiar::CudaPlatform::allocate_multicast(fiar::InProcessBootstrap&, std::size_t);
static_assert(fiar::Platform<fiar::CudaPlatform> && fiar::Platform<fiar::HostPlatform>);
static_assert(fiar::AllreduceWorkspace<fiar::Workspace<fiar::TrtllmPolicy, float, fiar::CudaPlatform>>);
static_assert(fiar::AllreduceWorkspace<fiar::AnyWorkspace<__half, fiar::HostPlatform>>);

// Launch shapes (exec::spread_shape): a cluster of up to 8 blocks per token at few tokens, at most the cap in all,
// threads a multiple of 32 covering a cluster's share of a token (32..512, exec::kMaxSpreadThreads; a lane loops
// beyond).
static_assert(fiar::CudaPlatform::launch_shape(1, 1, 132).blocks == 1);
static_assert(fiar::CudaPlatform::launch_shape(1, 1, 132).threads == 32);
static_assert(fiar::CudaPlatform::launch_shape(300, 896, 66).blocks == 66);    // bf16, hidden 7168, 2 ranks per GPU
static_assert(fiar::CudaPlatform::launch_shape(300, 896, 66).threads == 512);  // 2 vectors for some lanes
static_assert(fiar::CudaPlatform::launch_shape(5, 40, 16).threads == 64);
static_assert(fiar::CudaPlatform::launch_shape(5, 4096, 16) ==
              fiar::CudaLaunchShape{16, 512, 8});  // 2 clusters of 8 loop over 5 tokens
static_assert(fiar::CudaPlatform::launch_shape(1, 1024, 16) ==
              fiar::CudaLaunchShape{8, 128, 8});  // 1 token x 8192 bf16, W = 8 on one GPU
static_assert(fiar::CudaPlatform::launch_shape(1, 1024, 132) == fiar::CudaLaunchShape{8, 128, 8});
static_assert(fiar::CudaPlatform::launch_shape(1000, 1024, 132) == fiar::CudaLaunchShape{132, 512, 1});

int gxx_cuda_platform_check();  // gxx_cuda_platform.cpp

namespace {

template <fiar::AllreducePolicy P, fiar::ReduceType T>
struct Case {
  using Policy = P;
  using Type = T;
};

// The one list of {policy x dtype} cases: every Workspace specialization must be nameable.
using AllCases =
    std::tuple<Case<fiar::TrtllmPolicy, float>, Case<fiar::TrtllmPolicy, __half>,
               Case<fiar::TrtllmPolicy, __nv_bfloat16>, Case<fiar::MnnvlPolicy, float>, Case<fiar::MnnvlPolicy, __half>,
               Case<fiar::MnnvlPolicy, __nv_bfloat16>, Case<fiar::NcclPolicy, float>, Case<fiar::NcclPolicy, __half>,
               Case<fiar::NcclPolicy, __nv_bfloat16>>;

template <class C>
int check_case(const fiar::Topology& t) {
  [[maybe_unused]] fiar::Workspace<typename C::Policy, typename C::Type>* declared = nullptr;
  const bool runs = fiar::can_run_on(C::Policy::backend, t);
  try {
    fiar::check_topology<typename C::Policy>(t);
    return runs ? 0 : 1;
  } catch (const std::invalid_argument&) {
    return runs ? 1 : 0;
  }
}

template <class... C>
int check_all(std::tuple<C...>*, const fiar::Topology& t) {
  return (check_case<C>(t) + ...);
}

}  // namespace

int main() {
  int failures = 0;
  for (const fiar::Topology& t : {fiar_static_checks::kOneNode, fiar_static_checks::kTwoNodes,
                                  fiar_static_checks::kTwoNodesMulticast, fiar_static_checks::kNoPeers}) {
    failures += check_all(static_cast<AllCases*>(nullptr), t);
  }
  // The generic pieces, instantiated once each.
  fiar::InProcessGroup group(1);
  auto boot = group.bootstrap(0);
  failures += fiar::all_gather_value(boot, 42)[0] == 42 ? 0 : 1;
  fiar::LocalDevice fake;
  fake.node_id = "n";
  failures += fiar::discover_topology_report(boot, fake).topology.world_size == 1 ? 0 : 1;
  failures += fiar::dtype_name<float>() == "float" && fiar::dtype_name<__half>() == "half" ? 0 : 1;
  failures += gxx_cuda_platform_check();
  std::printf("instantiate-all: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
