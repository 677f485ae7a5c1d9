// Compile suite: every public template instantiated by nvcc for each configured architecture, plus the
// constant-expression checks. Running it confirms the instantiations link and behave.
#include <fiar/fiar.cuh>

#include <cstdio>
#include <tuple>

#include "static_checks.hpp"

// The CUDA side of the trtllm backend, fully instantiated for each dtype. World size is a runtime kernel
// parameter (1 to 16), so there is one kernel per dtype x strategy (allreduce instantiates both); meson
// passes one -gencode per entry of gpu_archs, so each kernel is built for every configured architecture.
// These definitions also serve gxx_cuda_platform.cpp, a g++ TU that only includes <fiar/fiar.hpp>.
template class fiar::Workspace<fiar::TrtllmPolicy, float, fiar::CudaPlatform>;
template class fiar::Workspace<fiar::TrtllmPolicy, __half, fiar::CudaPlatform>;
template class fiar::Workspace<fiar::TrtllmPolicy, __nv_bfloat16, fiar::CudaPlatform>;
#define FIAR_INSTANTIATE_CTOR(Policy, T)                                                                     \
  template fiar::detail::LamportWorkspace<fiar::Policy, T, fiar::CudaPlatform>::LamportWorkspace(               \
      fiar::InProcessBootstrap&, const fiar::Topology&, const fiar::WorkspaceConfig&, const fiar::CudaPlatformOptions&);
FIAR_INSTANTIATE_CTOR(TrtllmPolicy, float)
FIAR_INSTANTIATE_CTOR(TrtllmPolicy, __half)
FIAR_INSTANTIATE_CTOR(TrtllmPolicy, __nv_bfloat16)
FIAR_INSTANTIATE_CTOR(MnnvlPolicy, float)
FIAR_INSTANTIATE_CTOR(MnnvlPolicy, __half)
FIAR_INSTANTIATE_CTOR(MnnvlPolicy, __nv_bfloat16)
template std::vector<std::uint32_t*> fiar::CudaPlatform::allocate_shared(fiar::InProcessBootstrap&, std::size_t);
template fiar::algo::MulticastRegion fiar::CudaPlatform::allocate_multicast(fiar::InProcessBootstrap&, std::size_t);

// The mnnvl backend: the same protocols with the multicast transport (its own kernels, multimem stores).
template class fiar::detail::LamportWorkspace<fiar::TrtllmPolicy, float, fiar::CudaPlatform>;
template class fiar::detail::LamportWorkspace<fiar::TrtllmPolicy, __half, fiar::CudaPlatform>;
template class fiar::detail::LamportWorkspace<fiar::TrtllmPolicy, __nv_bfloat16, fiar::CudaPlatform>;
template class fiar::detail::LamportWorkspace<fiar::MnnvlPolicy, float, fiar::CudaPlatform>;
template class fiar::detail::LamportWorkspace<fiar::MnnvlPolicy, __half, fiar::CudaPlatform>;
template class fiar::detail::LamportWorkspace<fiar::MnnvlPolicy, __nv_bfloat16, fiar::CudaPlatform>;
template class fiar::Workspace<fiar::MnnvlPolicy, float, fiar::CudaPlatform>;
template class fiar::Workspace<fiar::MnnvlPolicy, __half, fiar::CudaPlatform>;
template class fiar::Workspace<fiar::MnnvlPolicy, __nv_bfloat16, fiar::CudaPlatform>;

// Every fused pattern: one kernel per pattern x dtype x strategy (run<P> instantiates both strategies).
#define FIAR_INSTANTIATE_RUN(T, P)                                                                          \
  template void fiar::detail::LamportWorkspace<fiar::TrtllmPolicy, T, fiar::CudaPlatform>::run<fiar::Pattern::P>( \
      const fiar::FusedArgs<T>&, cudaStream_t, fiar::Strategy);                                              \
  template void fiar::detail::LamportWorkspace<fiar::MnnvlPolicy, T, fiar::CudaPlatform>::run<fiar::Pattern::P>(  \
      const fiar::FusedArgs<T>&, cudaStream_t, fiar::Strategy);
#define FIAR_INSTANTIATE_PATTERNS(T)                  \
  FIAR_INSTANTIATE_RUN(T, ResidualRmsNorm)            \
  FIAR_INSTANTIATE_RUN(T, ResidualRmsNormFp8)         \
  FIAR_INSTANTIATE_RUN(T, ResidualRmsNormFp8Dynamic)  \
  FIAR_INSTANTIATE_RUN(T, ResidualRmsNormNvfp4)
FIAR_INSTANTIATE_PATTERNS(float)
FIAR_INSTANTIATE_PATTERNS(__half)
FIAR_INSTANTIATE_PATTERNS(__nv_bfloat16)

// The nccl backend: ncclAllReduce, then the epilogue kernel (one per pattern x dtype). It compiles in a build
// without NCCL too (its constructors then throw), so these lines need no guard.
#define FIAR_INSTANTIATE_NCCL(T)                                                                              \
  template class fiar::Workspace<fiar::NcclPolicy, T, fiar::CudaPlatform>;                                     \
  template fiar::Workspace<fiar::NcclPolicy, T, fiar::CudaPlatform>::Workspace(                                \
      fiar::InProcessBootstrap&, const fiar::Topology&, const fiar::WorkspaceConfig&, const fiar::CudaPlatformOptions&); \
  template fiar::Workspace<fiar::NcclPolicy, T, fiar::CudaPlatform>::Workspace(                                \
      fiar::InProcessBootstrap&, fiar::NcclComm, const fiar::Topology&, const fiar::WorkspaceConfig&,           \
      const fiar::CudaPlatformOptions&);                                                                        \
  template void fiar::Workspace<fiar::NcclPolicy, T, fiar::CudaPlatform>::run<fiar::Pattern::ResidualRmsNorm>(  \
      const fiar::FusedArgs<T>&, cudaStream_t, fiar::Strategy);                                                \
  template void fiar::Workspace<fiar::NcclPolicy, T, fiar::CudaPlatform>::run<fiar::Pattern::ResidualRmsNormFp8>( \
      const fiar::FusedArgs<T>&, cudaStream_t, fiar::Strategy);                                                \
  template void                                                                                                \
  fiar::Workspace<fiar::NcclPolicy, T, fiar::CudaPlatform>::run<fiar::Pattern::ResidualRmsNormFp8Dynamic>(      \
      const fiar::FusedArgs<T>&, cudaStream_t, fiar::Strategy);                                                \
  template void fiar::Workspace<fiar::NcclPolicy, T, fiar::CudaPlatform>::run<fiar::Pattern::ResidualRmsNormNvfp4>( \
      const fiar::FusedArgs<T>&, cudaStream_t, fiar::Strategy);
FIAR_INSTANTIATE_NCCL(float)
FIAR_INSTANTIATE_NCCL(__half)
FIAR_INSTANTIATE_NCCL(__nv_bfloat16)

// Launch shapes: one block per token up to the cap, threads a multiple of 32 covering a token (32..1024).
static_assert(fiar::CudaPlatform::launch_shape(1, 1, 132).blocks == 1);
static_assert(fiar::CudaPlatform::launch_shape(1, 1, 132).threads == 32);
static_assert(fiar::CudaPlatform::launch_shape(300, 896, 66).blocks == 66);   // bf16, hidden 7168, 2 ranks per GPU
static_assert(fiar::CudaPlatform::launch_shape(300, 896, 66).threads == 896);
static_assert(fiar::CudaPlatform::launch_shape(5, 40, 16).threads == 64);
static_assert(fiar::CudaPlatform::launch_shape(5, 4096, 16).threads == 1024);  // lanes loop over the rest

int gxx_cuda_platform_check();  // gxx_cuda_platform.cpp

namespace {

template <fiar::AllreducePolicy P, fiar::ReduceType T>
struct Case {
  using Policy = P;
  using Type = T;
};

// The one list of {policy x dtype} cases: every Workspace specialization must be nameable.
using AllCases = std::tuple<Case<fiar::TrtllmPolicy, float>, Case<fiar::TrtllmPolicy, __half>,
                            Case<fiar::TrtllmPolicy, __nv_bfloat16>, Case<fiar::MnnvlPolicy, float>,
                            Case<fiar::MnnvlPolicy, __half>, Case<fiar::MnnvlPolicy, __nv_bfloat16>,
                            Case<fiar::NcclPolicy, float>, Case<fiar::NcclPolicy, __half>,
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
