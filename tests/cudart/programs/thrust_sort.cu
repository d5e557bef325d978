// SPDX-License-Identifier: Apache-2.0
// Thrust, as most CUDA C++ users first meet it: device vectors, a transform
// with a device lambda, reduce, sort and an inclusive scan, checked against
// the same computation on the CPU. Built with -arch=sm_90 (Thrust's kernels
// then use sm_90 PTX, prefetch.global.L2 among it).
#include <thrust/device_vector.h>
#include <thrust/reduce.h>
#include <thrust/scan.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "common.h"

int main() {
  const int n = 100000;
  auto mix = [] __host__ __device__(int x) { return static_cast<int>((1LL * x * 7919) % 10007); };
  thrust::device_vector<int> v(n);
  thrust::sequence(v.begin(), v.end());
  thrust::transform(v.begin(), v.end(), v.begin(), mix);
  const long long sum = thrust::reduce(v.begin(), v.end(), 0LL);
  thrust::sort(v.begin(), v.end());
  thrust::inclusive_scan(v.begin(), v.end(), v.begin());
  std::vector<int> got(n);
  thrust::copy(v.begin(), v.end(), got.begin());

  std::vector<int> expected(n);
  for (int i = 0; i < n; ++i) expected[i] = mix(i);
  const long long expectedSum = std::accumulate(expected.begin(), expected.end(), 0LL);
  std::sort(expected.begin(), expected.end());
  std::inclusive_scan(expected.begin(), expected.end(), expected.begin());
  if (sum != expectedSum || got != expected) {
    std::printf("MISMATCH: sum %lld, expected %lld\n", sum, expectedSum);
    return 1;
  }
  std::printf("thrust_sort OK sum %lld scan %016llx\n", sum, checksum(got.data(), got.size() * sizeof(int)));
  return 0;
}
