// SPDX-License-Identifier: Apache-2.0
// A deterministic CPU job for checkpoint/restore smoke tests: a hash chain
// over N iterations, one line per iteration, and a final checksum.
#include <unistd.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s ITERATIONS MILLISECONDS_PER_ITERATION\n", argv[0]);
    return 2;
  }
  const long iterations = std::strtol(argv[1], nullptr, 10);
  const long ms = std::strtol(argv[2], nullptr, 10);
  if (iterations <= 0 || ms < 0) {
    std::fprintf(stderr, "%s: ITERATIONS must be > 0 and MILLISECONDS >= 0\n", argv[0]);
    return 2;
  }
  // Some heap state, so that a restore that lost memory shows in the checksum.
  std::vector<uint64_t> state(1 << 16);
  for (size_t i = 0; i < state.size(); ++i) state[i] = splitmix(i);
  uint64_t sum = 0;
  for (long it = 0; it < iterations; ++it) {
    for (size_t i = 0; i < state.size(); ++i) {
      state[i] = splitmix(state[i] ^ static_cast<uint64_t>(it));
      sum ^= state[i];
    }
    std::printf("iteration %ld checksum %016" PRIx64 "\n", it, sum);
    std::fflush(stdout);
    usleep(static_cast<useconds_t>(ms * 1000));
  }
  std::printf("final %016" PRIx64 "\n", sum);
  return 0;
}
