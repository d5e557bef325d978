// SPDX-License-Identifier: Apache-2.0
// The launch API before CUDA 4.0, deprecated since and still in cuda.h:
// cuFuncSetBlockShape, cuFuncSetSharedSize, cuParamSetSize, cuParamSeti,
// cuParamSetf and cuParamSetv set a function's next launch piece by piece,
// and cuLaunch, cuLaunchGrid and cuLaunchGridAsync launch it. What they set
// is kept here, per function, in the process that includes this (vgpu's
// libcuda, or the shim, where the state is the application's like the
// rest of its memory), and a launch is the exported cuLaunchKernel with the
// parameters as one buffer (CU_LAUNCH_PARAM_BUFFER_POINTER): vgpu's own, or
// the shim's, which remotes it.
//
// The parameter buffer grows as parameters are set (programs of the time set
// them at increasing offsets and give the total with cuParamSetSize last);
// a launch passes the size cuParamSetSize gave, the bytes never set zero.
// A function's state outlives its module: a function that gets the same
// handle later starts from what the old one left.
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace phos::legacy_launch {

// cuLaunchKernel's limit on a kernel's parameters (CUDA 12.1 and later).
constexpr size_t kMaxParamBytes = 32764;

struct FunctionState {
  std::array<unsigned, 3> block{0, 0, 0};
  unsigned sharedBytes = 0;
  size_t paramSize = 0;
  std::vector<std::byte> params;
};

class Functions {
 public:
  static Functions& instance() {
    static Functions functions;
    return functions;
  }
  // Runs `change` on f's state, under the lock.
  template <typename Change>
  void update(CUfunction f, Change&& change) {
    std::lock_guard lock(mutex_);
    change(states_[f]);
  }
  FunctionState get(CUfunction f) {
    std::lock_guard lock(mutex_);
    auto it = states_.find(f);
    return it == states_.end() ? FunctionState{} : it->second;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<CUfunction, FunctionState> states_;
};

// CUDA_SUCCESS when `f` is a function the driver knows (in the current
// context's sense: cuFuncGetAttribute answers for it).
inline CUresult checkFunction(CUfunction f) {
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  int registers = 0;
  return ::cuFuncGetAttribute(&registers, CU_FUNC_ATTRIBUTE_NUM_REGS, f);
}

inline CUresult setBlockShape(CUfunction f, int x, int y, int z) {
  if (CUresult r = checkFunction(f); r != CUDA_SUCCESS) return r;
  if (x <= 0 || y <= 0 || z <= 0) return CUDA_ERROR_INVALID_VALUE;
  Functions::instance().update(f, [&](FunctionState& s) {
    s.block = {static_cast<unsigned>(x), static_cast<unsigned>(y), static_cast<unsigned>(z)};
  });
  return CUDA_SUCCESS;
}

inline CUresult setSharedSize(CUfunction f, unsigned bytes) {
  if (CUresult r = checkFunction(f); r != CUDA_SUCCESS) return r;
  Functions::instance().update(f, [&](FunctionState& s) { s.sharedBytes = bytes; });
  return CUDA_SUCCESS;
}

inline CUresult setParamSize(CUfunction f, unsigned bytes) {
  if (CUresult r = checkFunction(f); r != CUDA_SUCCESS) return r;
  if (bytes > kMaxParamBytes) return CUDA_ERROR_INVALID_VALUE;
  Functions::instance().update(f, [&](FunctionState& s) { s.paramSize = bytes; });
  return CUDA_SUCCESS;
}

inline CUresult setParam(CUfunction f, int offset, const void* data, unsigned bytes) {
  if (CUresult r = checkFunction(f); r != CUDA_SUCCESS) return r;
  if (offset < 0 || (data == nullptr && bytes != 0) || bytes > kMaxParamBytes ||
      static_cast<size_t>(offset) > kMaxParamBytes - bytes) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Functions::instance().update(f, [&](FunctionState& s) {
    const size_t end = static_cast<size_t>(offset) + bytes;
    if (s.params.size() < end) s.params.resize(end);
    if (bytes != 0) std::memcpy(s.params.data() + offset, data, bytes);
  });
  return CUDA_SUCCESS;
}

// A grid of `width` x `height` blocks of the shape cuFuncSetBlockShape set
// (none set: cuLaunchKernel's CUDA_ERROR_INVALID_VALUE for an empty block).
inline CUresult launch(CUfunction f, int width, int height, CUstream stream) {
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (width <= 0 || height <= 0) return CUDA_ERROR_INVALID_VALUE;
  FunctionState s = Functions::instance().get(f);
  s.params.resize(s.paramSize);
  size_t size = s.paramSize;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, s.params.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, CU_LAUNCH_PARAM_END};
  return ::cuLaunchKernel(f, static_cast<unsigned>(width), static_cast<unsigned>(height), 1,
                          s.block[0], s.block[1], s.block[2], s.sharedBytes, stream, nullptr,
                          extra);
}

}  // namespace phos::legacy_launch
