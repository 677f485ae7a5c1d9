// SPDX-License-Identifier: Apache-2.0
// fiar/comm/auth.hpp — what the TCP bootstrap proves a rank with: SHA-256 (FIPS 180-4), HMAC-SHA-256 (RFC 2104) over
// the job's token, a constant-time comparison, and nonces from the kernel's random source.
// Contract: host only, no allocation beyond the inputs; sha256 / hmac_sha256 match the standards' test vectors
// (test_tcp_bootstrap.cpp checks them); random_bytes throws std::runtime_error when the kernel gives none.
#pragma once

#include <sys/random.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>

#include "../core/prelude.hpp"

FIAR_BEGIN_NAMESPACE
namespace detail {

using Digest256 = std::array<std::byte, 32>;

/// SHA-256, fed in pieces.
class Sha256 {
 public:
  void update(std::span<const std::byte> data) {
    for (std::byte b : data) {
      block_[fill_++] = static_cast<std::uint8_t>(b);
      if (fill_ == 64) {
        compress();
        fill_ = 0;
      }
    }
    bits_ += std::uint64_t{8} * data.size();
  }
  Digest256 finish() {
    const std::uint64_t bits = bits_;
    const std::byte one{0x80}, zero{0};
    update({&one, 1});
    while (fill_ != 56) update({&zero, 1});
    std::byte length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<std::byte>(bits >> (56 - 8 * i));
    update(length);
    Digest256 out;
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 4; ++j)
        out[static_cast<std::size_t>(4 * i + j)] = static_cast<std::byte>(h_[i] >> (24 - 8 * j));
    }
    return out;
  }

 private:
  static constexpr std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void compress() {
    static constexpr std::uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = std::uint32_t{block_[4 * i]} << 24 | std::uint32_t{block_[4 * i + 1]} << 16 |
             std::uint32_t{block_[4 * i + 2]} << 8 | std::uint32_t{block_[4 * i + 3]};
    }
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  std::uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::uint8_t block_[64] = {};
  std::size_t fill_ = 0;
  std::uint64_t bits_ = 0;
};

inline Digest256 sha256(std::span<const std::byte> data) {
  Sha256 s;
  s.update(data);
  return s.finish();
}

/// HMAC-SHA-256 of `message` under `key`.
inline Digest256 hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> message) {
  std::byte k[64] = {};
  if (key.size() > 64) {
    const Digest256 hashed = sha256(key);
    std::memcpy(k, hashed.data(), hashed.size());
  } else if (!key.empty()) {
    std::memcpy(k, key.data(), key.size());
  }
  std::byte pad[64];
  Sha256 inner;
  for (int i = 0; i < 64; ++i) pad[i] = k[i] ^ std::byte{0x36};
  inner.update(pad);
  inner.update(message);
  const Digest256 inside = inner.finish();
  Sha256 outer;
  for (int i = 0; i < 64; ++i) pad[i] = k[i] ^ std::byte{0x5c};
  outer.update(pad);
  outer.update(inside);
  return outer.finish();
}

/// Whether a and b are equal, in a time that does not depend on where they differ.
inline bool equal_in_constant_time(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.size() != b.size()) return false;
  std::uint8_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ |= static_cast<std::uint8_t>(a[i] ^ b[i]);
  return differ == 0;
}

/// Fills `out` from the kernel's random source (getrandom).
inline void random_bytes(std::span<std::byte> out) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t got = ::getrandom(out.data() + done, out.size() - done, 0);
    if (got > 0) {
      done += static_cast<std::size_t>(got);
    } else if (got < 0 && errno != EINTR) {
      throw std::runtime_error(std::string("fiar: getrandom failed: ") + std::strerror(errno));
    }
  }
}

}  // namespace detail
FIAR_END_NAMESPACE
