// SPDX-License-Identifier: Apache-2.0
// Contexts' usage counts, deprecated since CUDA 4 and still in cuda.h:
// cuCtxAttach counts one more user of the current context, cuCtxDetach one
// fewer and destroys the context when none is left. A context starts with
// one (its creator's); cuCtxDestroy destroys it whatever its count. Kept in
// the process that includes this (vgpu's libcuda, or the shim, where the
// context stack is too), made of the exported cuCtxGetCurrent and
// cuCtxDestroy: vgpu's own, or the shim's.
#pragma once

#include <cuda.h>

#include <mutex>
#include <unordered_map>

namespace phos::context_usage {

class Counts {
 public:
  static Counts& instance() {
    static Counts counts;
    return counts;
  }
  void attach(CUcontext c) {
    std::lock_guard lock(mutex_);
    ++extra_[c];
  }
  // One user fewer; true when none is left.
  bool detach(CUcontext c) {
    std::lock_guard lock(mutex_);
    auto it = extra_.find(c);
    if (it == extra_.end()) return true;
    if (--it->second == 0) extra_.erase(it);
    return false;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<CUcontext, int> extra_;  // users beyond the creator
};

// "fails if there is no context current to the thread"; "flags must be 0".
inline CUresult attach(CUcontext* pctx, unsigned int flags) {
  if (pctx == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  CUcontext current = nullptr;
  if (CUresult r = ::cuCtxGetCurrent(&current); r != CUDA_SUCCESS) return r;
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Counts::instance().attach(current);
  *pctx = current;
  return CUDA_SUCCESS;
}

// "The context ... must be current to the calling thread."
inline CUresult detach(CUcontext ctx) {
  CUcontext current = nullptr;
  if (CUresult r = ::cuCtxGetCurrent(&current); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr || ctx != current) return CUDA_ERROR_INVALID_CONTEXT;
  if (!Counts::instance().detach(ctx)) return CUDA_SUCCESS;
  return ::cuCtxDestroy(ctx);
}

}  // namespace phos::context_usage
