// Compile suite: every public template instantiated by nvcc for each configured architecture, plus the
// constant-expression checks. Running it confirms the instantiations link and behave.
#include <cstdio>
#include <tuple>

#include "static_checks.hpp"

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
  std::printf("instantiate-all: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
