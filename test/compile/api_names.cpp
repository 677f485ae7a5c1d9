// SPDX-License-Identifier: Apache-2.0
// The public names docs/api.md lists compile through <fiar/fiar.hpp> with their documented shapes (a g++ TU of the
// compile-checks target; nothing here runs). A name that moves or changes its signature breaks this file, and the docs
// with it.
#include <fiar/fiar.hpp>

#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace fiar_api_names {

using namespace fiar;

// Backends, topology and the choice.
static_assert(std::is_enum_v<Backend> && std::same_as<decltype(backend_env_var), const char* const>);
static_assert(std::same_as<decltype(accepted_backend_names), const std::string_view>);
static_assert(std::same_as<decltype(to_string(Backend::Auto)), std::string_view>);
static_assert(parse_backend("nccl") == Backend::Nccl && is_valid(Backend::Mnnvl));
static_assert(std::same_as<decltype(backend_from_env()), Backend>);
static_assert(std::same_as<decltype(resolve_backend(Backend::Auto, Topology{})), Resolution>);
static_assert(std::same_as<decltype(Resolution{}.allow_trtllm_fallback), bool>);
static_assert(rejection_for(Backend::Trtllm, Topology{}) == Rejection::none);
static_assert(rejection_for<NcclPolicy>(Topology{}) == Rejection::none);
static_assert(can_run_on(Backend::Nccl, Topology{}) && best_alternative(Backend::Nccl, Topology{}) == Backend::Trtllm);
static_assert(std::same_as<decltype(why_not(Backend::Mnnvl, Topology{})), std::string>);
static_assert(std::same_as<policy_for_t<Topology{}>, TrtllmPolicy>);
static_assert(std::same_as<policy_for_backend_t<Backend::Mnnvl>, MnnvlPolicy>);
static_assert(AllreducePolicy<NcclPolicy> && ReduceType<__nv_bfloat16> && dtype_name<__half>() == "half");
static_assert(std::same_as<decltype(&validate_topology), void (*)(const Topology&)>);
static_assert(requires(const Topology& t) {
  check_topology<TrtllmPolicy>(t);
  { to_string(t) } -> std::same_as<std::string>;
  { arch_name(90) } -> std::same_as<std::string>;
  { node_index_of_ranks(std::span<const std::string_view>{}) } -> std::same_as<std::vector<int>>;
  { count_nodes(std::span<const std::string_view>{}) } -> std::same_as<int>;
});

// Strategies, patterns, fusion.
static_assert(to_string(Strategy::TwoShot) == "twoshot" &&
              to_string(Pattern::ResidualRmsNorm) == std::string_view("residual_rmsnorm") &&
              to_string(Pattern::RmsNorm) == std::string_view("rmsnorm"));
// RmsNorm: a norm without a residual (in, gamma, norm_out).
static_assert(pattern_traits(Pattern::RmsNorm).norm &&
              pattern_traits(Pattern::RmsNorm).use[static_cast<int>(FusedTensor::ResidualIn)] == TensorUse::Unused &&
              pattern_traits(Pattern::RmsNorm).use[static_cast<int>(FusedTensor::NormOut)] == TensorUse::Required);
// The pre/post norm: both weights (gamma_pre, gamma) and the residual.
static_assert(to_string(Pattern::ResidualRmsNormPrePost) == std::string_view("residual_rmsnorm_prepost") &&
              pattern_traits(Pattern::ResidualRmsNormPrePost).use[static_cast<int>(FusedTensor::GammaPre)] ==
                  TensorUse::Required &&
              std::same_as<decltype(FusedArgs<float>{}.gamma_pre), const float*>);
// Per-token-group FP8: group size and scale format in FusedArgs, the scales' size (torch.empty_strided's storage of a
// [5, 2] int32 tensor with strides (1, 8): 4 x (5 + 1 x 8) bytes).
static_assert(to_string(Pattern::ResidualRmsNormFp8Group) == std::string_view("residual_rmsnorm_fp8_group") &&
              pattern_traits(Pattern::ResidualRmsNormFp8Group).quant == Quant::Fp8Group &&
              FusedArgs<float>{}.group_size == 128 && FusedArgs<float>{}.group_scale == GroupScale::Ue8m0Packed &&
              to_string(GroupScale::Float32) == std::string_view("float32") && is_valid(GroupScale::Ue8m0Packed));
static_assert(algo::fp8_group_scale_bytes(5, 1024, 128, GroupScale::Ue8m0Packed) == 4 * (5 + 8) &&
              algo::fp8_group_scale_bytes(5, 1024, 128, GroupScale::Float32) == 4 * (5 + 7 * 8) &&
              algo::fp8_group_scale_offset(1, 5, 5, GroupScale::Ue8m0Packed) == 4 * (8 + 1) + 1);
// The MoE finalize: its tensors and scalars in FusedArgs, the prologue in the pattern table.
static_assert(pattern_traits(Pattern::MoeFinalizeResidualRmsNorm).prologue == Prologue::MoeFinalize &&
              pattern_traits(Pattern::ResidualRmsNorm).prologue == Prologue::None && kFusedTensorCount == 14 &&
              kMaxTopK == 64 && FusedArgs<float>{}.routed_scaling_factor == 1.0f &&
              std::same_as<decltype(FusedArgs<float>{}.expanded_idx_to_permuted_idx), const int*> &&
              std::same_as<decltype(FusedArgs<float>{}.expert_scale), const float*> &&
              std::same_as<decltype(FusedArgs<float>{}.shared_expert_out), const float*> &&
              to_string(Pattern::MoeFinalizeAllReduce) == std::string_view("moe_finalize_allreduce"));
// MXFP8: 32-element blocks, the NVFP4 layouts with hidden_dim / 32 columns.
static_assert(to_string(Pattern::ResidualRmsNormMxfp8) == std::string_view("residual_rmsnorm_mxfp8") &&
              pattern_traits(Pattern::ResidualRmsNormMxfp8).quant == Quant::Mxfp8 && algo::kMxfp8Block == 32 &&
              algo::kMaxGroupVecs == 32 && algo::mxfp8_scale_bytes(1, 1024, ScaleLayout::Linear) == 32 &&
              algo::mxfp8_scale_bytes(1, 1024, ScaleLayout::Swizzled128x4) == 128 * 32 &&
              algo::mxfp8_scale_offset(0, 1, 64, ScaleLayout::Linear) == 1 && algo::mxfp8_scale_cols(64) == 2 &&
              algo::block_scale_bytes(2, 5, ScaleLayout::Linear) == 10 &&
              algo::block_scale_offset(1, 0, 5, ScaleLayout::Swizzled128x4) == 16);
static_assert(default_oneshot_max_bytes(90, 8) == 128 * 1024 &&
              default_oneshot_max_bytes(Backend::Mnnvl, 90, 8) == 131072);
static_assert(choose_strategy(8, 16, 1 << 20, 1 << 19) == Strategy::TwoShot);
static_assert(algo::nvfp4_scale_bytes(1, 64, ScaleLayout::Swizzled128x4) == 128 * 4);
static_assert(algo::nvfp4_scale_offset(0, 1, 64, ScaleLayout::Linear) == 1 && algo::nvfp4_scale_cols(64) == 4);
static_assert(algo::round_up(5, 4) == 8 && algo::kFp8Max == 448.0f && algo::kFp4Max == 6.0f && algo::kNvfp4Block == 16);
static_assert(algo::fp8_dynamic_scale(448.0f) == 1.0f);
static_assert(requires(float x, std::uint8_t q) {
  { algo::to_fp8_e4m3(x) } -> std::same_as<std::uint8_t>;
  { algo::from_fp8_e4m3(q) } -> std::same_as<float>;
  { algo::to_fp4_e2m1(x) } -> std::same_as<std::uint8_t>;
  { algo::from_fp4_e2m1(q) } -> std::same_as<float>;
});
static_assert(std::is_aggregate_v<WorkspaceConfig> && std::is_aggregate_v<FusedArgs<float>>);
static_assert(std::same_as<decltype(FusedArgs<float>{}.layout), ScaleLayout>);
static_assert(std::is_class_v<algo::EpilogueParams<float>> && std::is_class_v<algo::EpiloguePassParams<float>>);

// Workspaces, the run-time choice, the pool.
template <class W>
concept DocumentedWorkspace =
    AllreduceWorkspace<W> && requires(W& w, const W& cw, const Topology& t, const WorkspaceConfig& c) {
      typename W::policy_type;
      { W::required_bytes(t, c) } -> std::same_as<std::size_t>;
      { W::why_not(t, c) } -> std::same_as<std::string>;
      { W::can_implement(t, c) } -> std::same_as<bool>;
      { w.platform() } -> std::same_as<typename W::platform_type&>;
    };
static_assert(DocumentedWorkspace<Workspace<TrtllmPolicy, float, HostPlatform>>);
static_assert(DocumentedWorkspace<Workspace<MnnvlPolicy, __half, CudaPlatform>>);
static_assert(DocumentedWorkspace<Workspace<NcclPolicy, __nv_bfloat16, CudaPlatform>>);
static_assert(requires(const Workspace<TrtllmPolicy, float, HostPlatform>& w, const WorkspaceConfig& c) {
  { w.oneshot_threshold() } -> std::same_as<std::size_t>;
  { Workspace<TrtllmPolicy, float, HostPlatform>::buffer_words(8, 90, c) } -> std::same_as<std::size_t>;
});
static_assert(requires(const Workspace<NcclPolicy, float, CudaPlatform>& w) {
  { w.comm() } -> std::same_as<NcclComm>;
  { w.owns_comm() } -> std::same_as<bool>;
});
static_assert(std::constructible_from<Workspace<NcclPolicy, float, CudaPlatform>, InProcessBootstrap&, NcclComm,
                                      const Topology&, const WorkspaceConfig&, const CudaPlatformOptions&>);
static_assert(std::constructible_from<Workspace<TrtllmPolicy, float, HostPlatform>, InProcessBootstrap&,
                                      const Topology&, const WorkspaceConfig&, const HostPlatformOptions&>);
using Any = AnyWorkspace<float, HostPlatform>;
static_assert(DocumentedWorkspace<Any::Trtllm> && std::same_as<Any::Nccl, Workspace<NcclPolicy, float, HostPlatform>>);
static_assert(requires(Any& a, const Any& ca) {
  { ca.backend() } -> std::same_as<Backend>;
  { ca.resolution() } -> std::same_as<Resolution>;
  { ca.fell_back() } -> std::same_as<bool>;
  { a.template get_if<MnnvlPolicy>() } -> std::same_as<Any::Mnnvl*>;
});
static_assert(requires(InProcessBootstrap& b, const Topology& t, const WorkspaceConfig& c) {
  { make_workspace<float, HostPlatform>(b, t, c) } -> std::same_as<Any>;
  { make_workspace<float, HostPlatform>(b, t, c, Backend::Auto, HostPlatformOptions{}) } -> std::same_as<Any>;
  { make_workspace<float>(b, t, c, backend_from_env()) } -> std::same_as<AnyWorkspace<float, CudaPlatform>>;
});
static_assert(requires(WorkspacePool<HostPlatform>& p, const WorkspaceConfig& c) {
  { p.template acquire<float>("purpose", c) } -> std::same_as<Any&>;
  { p.template acquire<float>("purpose", c, Backend::Nccl) } -> std::same_as<Any&>;
  { p.size() } -> std::same_as<std::size_t>;
  { p.sharing_with("purpose") } -> std::same_as<std::vector<std::string>>;
  p.clear();
});
static_assert(std::constructible_from<WorkspacePool<HostPlatform>, InProcessBootstrap&, const Topology&, Backend,
                                      const HostPlatformOptions&>);
static_assert(config_can_serve(WorkspaceConfig{.max_token_num = 2, .hidden_dim = 8},
                               WorkspaceConfig{.max_token_num = 1, .hidden_dim = 8}));
static_assert(Bootstrap<BootstrapRef> && Bootstrap<InProcessBootstrap>);

// Platforms and the protocol layer.
static_assert(Platform<HostPlatform> && Platform<CudaPlatform>);
static_assert(std::same_as<CudaLaunchShape, exec::LaunchShape> && CudaPlatform::launch_shape(3, 64, 2).blocks == 2);
static_assert(requires(CudaPlatform& p, const CudaPlatform& cp, HostPlatform& h, InProcessBootstrap& b) {
  { p.allocate_multicast(b, 64) } -> std::same_as<algo::MulticastRegion>;
  { cp.device() } -> std::same_as<int>;
  { cp.sm_count() } -> std::same_as<int>;
  { cp.ranks_on_gpu() } -> std::same_as<int>;
  { cp.max_blocks() } -> std::same_as<int>;
  { cp.pdl() } -> std::same_as<bool>;
  { cp.options() } -> std::same_as<const CudaPlatformOptions&>;
  { h.allocate_multicast(b, 64) } -> std::same_as<MulticastRegion>;
  { h.multicast_stores() } -> std::same_as<std::uint32_t>;
  { h.grid() } -> std::same_as<const algo::HostGrid&>;
});
static_assert(algo::kMaxRanks == 64 && algo::kLamportBuffers == 3 && algo::kErrorNone == 0 && algo::kErrorTimeout == 1);
static_assert(std::is_enum_v<algo::Transport> && std::same_as<algo::MulticastView, exec::MulticastView>);
static_assert(std::is_class_v<algo::LamportState> && std::is_class_v<algo::ErrorRecord> &&
              std::is_class_v<algo::LamportParams<float>>);
static_assert(algo::oneshot_words(2, 3, 4) == 96 && algo::twoshot_chunk(4, 9) == 3 &&
              algo::twoshot_words(2, 2, 1) == 16);
static_assert(requires(algo::HostCtx& ctx, const algo::LamportParams<float>& p,
                       const algo::EpiloguePassParams<float>& e, const algo::EpilogueParams<float>& ep) {
  algo::lamport_oneshot<Pattern::AllReduce, float>(ctx, p);
  algo::lamport_twoshot<Pattern::AllReduce, float, algo::Transport::Multicast>(ctx, p);
  algo::epilogue_pass<Pattern::ResidualRmsNorm, float>(ctx, e);
  algo::finish_call_outputs<Pattern::ResidualRmsNormNvfp4, float>(ctx, ep, 1, 64);
  { algo::SystemAtomics::load_acquire(static_cast<const std::uint32_t*>(nullptr)) } -> std::same_as<std::uint32_t>;
});
static_assert(exec::ExecutionContext<algo::HostCtx>);

// User epilogues: the concept, the token view, the tag a kernel takes in a Pattern's place, and the calls.
struct ApiEpilogue {
  static constexpr const char* name = "api_epilogue";
  template <class T>
  struct Params {
    T* out;
  };
  template <class T, class Token>
  FIAR_HD static void finish(const Params<T>& p, Token& token) {
    token.for_each_vec([&](int v) { token.store(p.out, token.token(), v, token.sum(v)); });
    (void)token.cluster_max(token.cluster_sum([](int) { return 1.0f; }));
  }
};
static_assert(UserEpilogue<ApiEpilogue, float> && algo::UserEpilogue<ApiEpilogue, __half> &&
              !UserEpilogue<ApiEpilogue, int>);
static_assert(std::same_as<user_epilogue_t<user_epilogue<ApiEpilogue>>, ApiEpilogue> &&
              std::same_as<decltype(user_epilogue<ApiEpilogue>), const UserEpilogueTag<ApiEpilogue>* const>);
static_assert(is_pattern_v<Pattern::AllReduce> && !is_pattern_v<user_epilogue<ApiEpilogue>> &&
              epilogue_min_arch<user_epilogue<ApiEpilogue>>() == 0 &&
              epilogue_min_arch<Pattern::ResidualRmsNormNvfp4>() == 100 &&
              epilogue_prologue<Pattern::MoeFinalizeAllReduce>() == Prologue::MoeFinalize &&
              epilogue_code<Pattern::RmsNorm>() == 5 &&
              (epilogue_code<user_epilogue<ApiEpilogue>>() & 0xC0000000u) == kUserEpilogueCode);
static_assert(std::string_view(to_string(user_epilogue<ApiEpilogue>)) == "api_epilogue");
static_assert(
    std::same_as<algo::CallParams<Pattern::AllReduce, float>, algo::EpilogueParams<float>> &&
    std::same_as<algo::CallParams<user_epilogue<ApiEpilogue>, float>, algo::UserCallParams<ApiEpilogue, float>> &&
    std::derived_from<algo::UserCallParams<ApiEpilogue, float>, algo::EpilogueParams<float>>);
static_assert(std::derived_from<algo::LamportParams<float>, algo::LamportLinks> && sizeof(algo::Elems<__half>) == 16 &&
              EpilogueToken<float, algo::HostCtx, int>::kElems == 4);
static_assert(requires(algo::HostCtx& ctx,
                       const algo::LamportParams<float, algo::UserCallParams<ApiEpilogue, float>>& p,
                       Workspace<TrtllmPolicy, float, HostPlatform>& w, AnyWorkspace<float, HostPlatform>& any,
                       const float* in, ApiEpilogue::Params<float> up) {
  algo::lamport_oneshot<user_epilogue<ApiEpilogue>, float>(ctx, p);
  w.run<ApiEpilogue>(in, 1, up);
  any.run<ApiEpilogue>(in, 1, up, nullptr, Strategy::TwoShot);
});

// Discovery, bootstraps, logging, errors, NCCL, version.
static_assert(std::same_as<decltype(node_id_env_var), const char* const> && max_node_id_length == 127);
static_assert(requires(InProcessBootstrap& b, const LocalDevice& d, const TopologyOverrides& o) {
  { discover_topology(b) } -> std::same_as<Topology>;
  { discover_topology(b, o) } -> std::same_as<Topology>;
  { discover_topology_report(b, d, o) } -> std::same_as<DiscoveryReport>;
  { probe_local_device() } -> std::same_as<LocalDevice>;
  { default_node_id() } -> std::same_as<std::string>;
  { all_gather_value(b, 1) } -> std::same_as<std::vector<int>>;
});
static_assert(std::same_as<decltype(set_log_sink(LogSink{})), LogSink> && to_string(LogLevel::Warning) == "warning");
static_assert(requires { log(LogLevel::Info, "x"); });
static_assert(std::derived_from<multicast_error, cuda_error> && std::derived_from<cuda_error, std::runtime_error> &&
              std::derived_from<timeout_error, std::runtime_error>);
static_assert(std::same_as<decltype(built_with_nccl), const bool> && std::same_as<NcclComm, ::ncclComm*>);
#if FIAR_HAS_NCCL
static_assert(Bootstrap<NcclBootstrap>);
#endif
// Processes: the TCP bootstrap and the launchers' variables; the host emulator across processes.
static_assert(Bootstrap<TcpBootstrap> && std::constructible_from<TcpBootstrap, const TcpBootstrapOptions&>);
static_assert(std::same_as<decltype(TcpBootstrapOptions::from_environment()), TcpBootstrapOptions>);
static_assert(std::same_as<decltype(launch_environment()), LaunchEnvironment>);
static_assert(requires(const TcpBootstrap& b, TcpBootstrapOptions o, LaunchEnvironment e, HostPlatform& h,
                       AnyWorkspace<float, HostPlatform>& w) {
  { b.options() } -> std::same_as<const TcpBootstrapOptions&>;
  { o.master_port } -> std::same_as<int&>;
  { o.master_addr } -> std::same_as<std::string&>;
  { e.local_rank } -> std::same_as<int&>;
  { e.source } -> std::same_as<std::string&>;
  { h.across_processes() } -> std::same_as<bool>;
  { w.platform() } -> std::same_as<HostPlatform&>;
});

// Never slower than the alternatives: the interconnect fact, NCCL's symmetric windows, the in-switch reduction.
static_assert(to_string(Interconnect::Pcie) == "pcie" && Topology{}.interconnect == Interconnect::Unknown);
static_assert(slow_on(Backend::Trtllm, Topology{.world_size = 4, .interconnect = Interconnect::Pcie}) &&
              ranks_per_node(Topology{.world_size = 8, .node_count = 2}) == 4 && TrtllmPolicy::pcie_max_ranks == 2);
static_assert(std::same_as<decltype(expected_cost(Backend::Trtllm, Topology{})), std::string> &&
              std::same_as<decltype(why_auto_skips(Backend::Trtllm, Topology{})), std::string>);
static_assert(std::same_as<decltype(TopologyOverrides{}.interconnect), std::optional<Interconnect>>);
static_assert(std::same_as<decltype(nccl_version()), int> && std::same_as<decltype(nccl_symmetric_available()), bool>);
static_assert(to_string(Strategy::Multimem) == "multimem" && is_valid(Strategy::Multimem));
static_assert(std::same_as<decltype(WorkspaceConfig{}.multimem_min_bytes), std::optional<std::size_t>>);
static_assert(requires(const Workspace<NcclPolicy, float, CudaPlatform>& w) {
  { w.nccl_symmetric() } -> std::same_as<bool>;
  { w.nccl_classic_reason() } -> std::same_as<const std::string&>;
});

// One strategy table across backends, and the NCCL route of trtllm / mnnvl.
static_assert(to_string(Strategy::Nccl) == "nccl" && is_valid(Strategy::Nccl) &&
              never == std::numeric_limits<std::size_t>::max());
static_assert(std::same_as<decltype(WorkspaceConfig{}.nccl_min_bytes), std::optional<std::size_t>> &&
              std::same_as<decltype(WorkspaceConfig{}.nccl_symmetric_max_bytes), std::optional<std::size_t>>);
static_assert(default_strategy_thresholds(Backend::Trtllm, 90, 8, Interconnect::NvLink).oneshot_max_bytes ==
              default_oneshot_max_bytes(Backend::Trtllm, 90, 8));
static_assert(
    std::same_as<decltype(strategy_thresholds(Backend::Mnnvl, Topology{}, WorkspaceConfig{})), StrategyThresholds>);
static_assert(choose_strategy(StrategyThresholds{.oneshot_max_bytes = 0, .nccl_min_bytes = 1}, 2, 2, 1, false, true) ==
              Strategy::Nccl);
static_assert(requires(const Workspace<TrtllmPolicy, float, HostPlatform>& w,
                       const AnyWorkspace<float, HostPlatform>& a) {
  { w.strategy_thresholds() } -> std::same_as<const StrategyThresholds&>;
  { w.has_nccl_route() } -> std::same_as<bool>;
  { w.nccl_route_reason() } -> std::same_as<const std::string&>;
  { a.strategy_thresholds() } -> std::same_as<const StrategyThresholds&>;
  { a.has_nccl_route() } -> std::same_as<bool>;
  { a.nccl_route_reason() } -> std::same_as<const std::string&>;
});

// Log levels.
static_assert(severity(LogLevel::Debug) < severity(LogLevel::Info) && parse_log_level("ERROR") == LogLevel::Error);
static_assert(std::same_as<decltype(log_level()), LogLevel> &&
              std::same_as<decltype(log_enabled(LogLevel::Info)), bool>);

static_assert(version_major == 0 && version_minor == 1 && std::string_view(version_string) == "0.1.0");

}  // namespace fiar_api_names
