// SPDX-License-Identifier: Apache-2.0
// fiar/comm/mpi_bootstrap.hpp — a Bootstrap over an MPI communicator, for programs launched by mpirun that use MPI.
// Not included by <fiar/fiar.hpp>: include it after <mpi.h> in a program linked with MPI (Meson: fiar's tests find
// it as the optional dependency 'mpi').
// Contract: the caller initialises MPI (and finalises it after every workspace is gone); the bootstrap works on its
// own duplicate of the communicator, so its collectives never match the program's. Every collective is non-blocking
// and polled until the timeout: a rank that never arrives gives fiar::timeout_error instead of a hang (Open MPI's
// mpirun usually ends the whole job first when a rank dies).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../core/errors.hpp"
#include "../core/prelude.hpp"
#include "bootstrap.hpp"

FIAR_BEGIN_NAMESPACE

/// Rank MPI_Comm_rank(comm) of a group of MPI_Comm_size(comm) ranks; satisfies Bootstrap. The constructor is
/// collective over `comm` (MPI_Comm_dup).
class MpiBootstrap {
 public:
  explicit MpiBootstrap(MPI_Comm comm = MPI_COMM_WORLD, std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : timeout_(timeout) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized == 0) {
      throw std::logic_error("fiar: MpiBootstrap needs MPI initialised. Fix: call MPI_Init before creating it.");
    }
    if (timeout.count() <= 0) {
      throw std::invalid_argument("fiar: MpiBootstrap timeout = " + std::to_string(timeout.count()) +
                                  " ms; allowed: more than 0 ms.");
    }
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  MpiBootstrap(const MpiBootstrap&) = delete;
  MpiBootstrap& operator=(const MpiBootstrap&) = delete;
  ~MpiBootstrap() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A broken group's communicator may still have a collective in flight: leave it to MPI_Finalize / the exit.
    if (finalized == 0 && broken_.empty()) MPI_Comm_free(&comm_);
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }

  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
    detail::check_gather_output(rank_, size_, in, out);
    // Every rank must pass the same size: exchange the sizes first, so that a mismatch is an error, not UB.
    unsigned long long mine = in.size();
    std::vector<unsigned long long> sizes(static_cast<std::size_t>(size_));
    MPI_Request sizes_request{};
    enter();
    check(MPI_Iallgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, sizes.data(), 1, MPI_UNSIGNED_LONG_LONG, comm_,
                         &sizes_request),
          "MPI_Iallgather");
    wait(sizes_request, "all_gather (block sizes)");
    for (int r = 0; r < size_; ++r) {
      if (sizes[static_cast<std::size_t>(r)] != mine) {
        throw std::invalid_argument("fiar: all_gather block sizes differ: rank " + std::to_string(rank_) + " gave " +
                                    std::to_string(mine) + " bytes, rank " + std::to_string(r) + " gave " +
                                    std::to_string(sizes[static_cast<std::size_t>(r)]) +
                                    " bytes. Fix: every rank must pass the same number of bytes to each collective.");
      }
    }
    if (in.empty()) return;
    if (in.size() > static_cast<std::size_t>(1) << 30) {
      throw std::invalid_argument("fiar: MpiBootstrap all_gather of " + std::to_string(in.size()) +
                                  " bytes per rank; allowed: at most 1 GiB.");
    }
    MPI_Request request{};
    check(MPI_Iallgather(in.data(), static_cast<int>(in.size()), MPI_BYTE, out.data(), static_cast<int>(in.size()),
                         MPI_BYTE, comm_, &request),
          "MPI_Iallgather");
    wait(request, "all_gather");
  }

  void barrier() {
    enter();
    MPI_Request request{};
    check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
    wait(request, "barrier");
  }

 private:
  void enter() const {
    if (!broken_.empty()) throw timeout_error(broken_);
  }

  void check(int rc, const char* call) const {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int n = 0;
    MPI_Error_string(rc, text, &n);
    throw std::runtime_error("fiar: " + std::string(call) + " failed on rank " + std::to_string(rank_) + ": " +
                             std::string(text, static_cast<std::size_t>(n)));
  }

  void wait(MPI_Request& request, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (unsigned spin = 0;; ++spin) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done != 0) return;
      if (std::chrono::steady_clock::now() > deadline) {
        broken_ = "fiar: MpiBootstrap " + std::string(what) + " timed out after " + std::to_string(timeout_.count()) +
                  " ms on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                  ": a rank did not arrive (it hung, died or called a different collective); the group is unusable "
                  "now.";
        throw timeout_error(broken_);
      }
      if (spin > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  std::string broken_;
};

static_assert(Bootstrap<MpiBootstrap>);

FIAR_END_NAMESPACE
