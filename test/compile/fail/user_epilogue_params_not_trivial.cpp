// SPDX-License-Identifier: Apache-2.0
// run<E> with a user epilogue whose Params are not trivially copyable (they travel by value as a kernel parameter): E
// does not satisfy UserEpilogue, and no run<E> matches.
// expect-g++: satisfaction of .UserEpilogue<E, T>. \[with E = Epi; T = float\]
// expect-nvcc: no instance of overloaded function "fiar::.*::Workspace<P, T, Pf>::run \[with P=fiar::.*TrtllmPolicy,
// T=float
#include <fiar/fiar.hpp>

#include <string>

struct Epi {
  static constexpr const char* name = "epi";
  template <class T>
  struct Params {
#ifdef FIAR_EXPECT_OK
    const char* text;
#else
    std::string text;
#endif
  };
  template <class T, class Token>
  FIAR_HD static void finish(const Params<T>&, Token&) {}
};

inline void call(fiar::Workspace<fiar::TrtllmPolicy, float, fiar::HostPlatform>& ws, const float* in) {
  ws.run<Epi>(in, 1, Epi::Params<float>{});
}
