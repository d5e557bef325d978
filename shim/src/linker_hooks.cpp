// SPDX-License-Identifier: Apache-2.0
// The shim's side of the linker (cuLink*, served by phosd's
// daemon/src/remoting/linker.cpp): what it keeps of each state the program
// holds (the options it was created with, whose outputs and logs come back
// with every later call, and the linked image, which lives until
// cuLinkDestroy as CUDA says), and the buffer phosd writes the image into.
#include <cuda.h>
#include <sys/mman.h>

#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "client_call.h"
#include "phos/cuda_api/client_hooks.h"
#include "wire_support.h"

namespace phos::shim {
namespace {

// Address space reserved for a linked image (untouched pages cost nothing):
// phosd refuses an image larger than this with CUDA_ERROR_OUT_OF_MEMORY.
constexpr size_t kImageReserve = size_t{256} << 20;

struct Link {
  std::vector<CUjit_option> options;  // cuLinkCreate's, copied
  void** values = nullptr;            // the program's: the driver's outputs go there
  void* image = nullptr;              // cuLinkComplete's, until cuLinkDestroy
  size_t mapped = 0;
};

std::mutex& linksMutex() {
  static std::mutex m;
  return m;
}
std::map<uint64_t, Link>& links() {
  static std::map<uint64_t, Link> all;
  return all;
}

// The reservation cuLinkComplete's prologue made on this thread.
thread_local void* pendingImage = nullptr;

size_t pageRound(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (std::max<size_t>(bytes, 1) + page - 1) / page * page;
}

// The create options' outputs (wall time, log sizes, logs), into the
// program's values: only where it asked for an output, as it then keeps
// its arrays for the state's life.
void applyLinkOutputs(CUlinkState state, const ipc::JitOutputs& outputs) {
  std::lock_guard lock(linksMutex());
  auto it = links().find(ClientCall::handleId(state));
  if (it == links().end()) return;
  const Link& l = it->second;
  bool wantsOutputs = false;
  for (CUjit_option o : l.options) wantsOutputs |= ipc::jitValue(o) != ipc::JitValue::kScalar;
  if (wantsOutputs)
    applyJitOutputs(outputs, static_cast<unsigned>(l.options.size()), l.options.data(), l.values);
}

}  // namespace

namespace prologue {

std::optional<CUresult> cuLinkComplete(CUlinkState, void** cubinOut, size_t*, uint64_t* buffer,
                                       uint64_t* capacity) {
  if (cubinOut == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // A reservation whose call never came back (phosd gone) is given back.
  if (pendingImage != nullptr) munmap(pendingImage, kImageReserve);
  pendingImage = nullptr;
  void* p = mmap(nullptr, kImageReserve, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  pendingImage = p;
  *buffer = reinterpret_cast<uintptr_t>(p);
  *capacity = kImageReserve;
  return std::nullopt;
}

}  // namespace prologue

namespace epilogue {

CUresult cuLinkCreate(CUresult result, unsigned int numOptions, CUjit_option* options,
                      void** optionValues, CUlinkState* stateOut) {
  if (result != CUDA_SUCCESS) return result;
  Link l;
  if (numOptions > 0) l.options.assign(options, options + numOptions);
  l.values = optionValues;
  std::lock_guard lock(linksMutex());
  links()[ClientCall::handleId(*stateOut)] = std::move(l);
  return result;
}

CUresult cuLinkAddData(CUresult result, ipc::JitOutputs link, CUlinkState state, CUjitInputType,
                       void*, size_t, const char*, unsigned int, CUjit_option*, void**) {
  applyLinkOutputs(state, link);
  return result;
}

CUresult cuLinkAddFile(CUresult result, ipc::JitOutputs link, CUlinkState state, CUjitInputType,
                       const char*, unsigned int, CUjit_option*, void**) {
  applyLinkOutputs(state, link);
  return result;
}

CUresult cuLinkComplete(CUresult result, uint64_t bytes, ipc::JitOutputs link, CUlinkState state,
                        void** cubinOut, size_t* sizeOut) {
  applyLinkOutputs(state, link);
  void* image = pendingImage;
  pendingImage = nullptr;
  if (image == nullptr) return result;
  if (result != CUDA_SUCCESS || bytes > kImageReserve) {
    munmap(image, kImageReserve);
    return result != CUDA_SUCCESS ? result : CUDA_ERROR_UNKNOWN;
  }
  const size_t kept = pageRound(bytes);
  if (kept < kImageReserve) munmap(static_cast<char*>(image) + kept, kImageReserve - kept);
  {
    std::lock_guard lock(linksMutex());
    Link& l = links()[ClientCall::handleId(state)];
    if (l.image != nullptr) munmap(l.image, l.mapped);  // completed again: the newer image
    l.image = image;
    l.mapped = kept;
  }
  *cubinOut = image;
  if (sizeOut != nullptr) *sizeOut = bytes;
  return result;
}

CUresult cuLinkDestroy(CUresult result, CUlinkState state) {
  if (result != CUDA_SUCCESS) return result;
  std::lock_guard lock(linksMutex());
  auto it = links().find(ClientCall::handleId(state));
  if (it == links().end()) return result;
  if (it->second.image != nullptr) munmap(it->second.image, it->second.mapped);
  links().erase(it);
  return result;
}

}  // namespace epilogue
}  // namespace phos::shim
