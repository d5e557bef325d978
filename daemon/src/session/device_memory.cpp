// SPDX-License-Identifier: Apache-2.0
#include "session/device_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "phos/common/log.h"
#include "session/session_contexts.h"
#include "session/session_image.h"

namespace phos::daemon {

using json = nlohmann::json;

const Allocation* DeviceMemory::find(CUdeviceptr p) const {
  auto it = allocations_.upper_bound(p);
  if (it == allocations_.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  return p - a.address < a.bytes ? &a : nullptr;
}

void DeviceMemory::add(const Allocation& a) {
  Allocation& added = allocations_[a.address] = a;
  if (added.order == 0) added.order = takeOrder();
}

void DeviceMemory::removeGlobalsOf(void* module) {
  for (auto a = allocations_.begin(); a != allocations_.end();) {
    a = module != nullptr && a->second.module == module ? allocations_.erase(a) : std::next(a);
  }
}

void DeviceMemory::removeContext(uint64_t context,
                                 const std::function<void(const Allocation&)>& dropping) {
  for (auto a = allocations_.begin(); a != allocations_.end();) {
    if (a->second.context != context) {
      ++a;
      continue;
    }
    if (a->second.physical != 0) {
      (a++)->second.context = 0;
      continue;
    }
    dropping(a->second);
    if (a->second.module == nullptr) {
      if (auto h = heaps_.find(a->second.device); h != heaps_.end()) h->second->free(a->first);
    }
    a = allocations_.erase(a);
  }
}

void DeviceMemory::rehome(const std::function<uint64_t(int device)>& pick) {
  for (auto& [address, a] : allocations_) {
    if (a.physical != 0 && a.context == 0) a.context = pick(a.device);
  }
}

DeviceHeap& DeviceMemory::heap(int device) {
  auto& heap = heaps_[device];
  if (heap == nullptr) {
    heap = std::make_unique<DeviceHeap>(driver_, device, DeviceHeap::windowBase(session_, device),
                                        false);
  }
  return *heap;
}

CUresult DeviceMemory::allocate(int device, size_t bytes, CUdeviceptr* address) {
  return heap(device).allocate(bytes, address);
}

CUresult DeviceMemory::free(CUdeviceptr address) {
  const Allocation* a = find(address);
  if (a == nullptr || a->address != address || a->module != nullptr || a->physical != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto h = heaps_.find(a->device);
  if (h == heaps_.end()) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = h->second->free(address);
  if (r == CUDA_SUCCESS) allocations_.erase(address);
  return r;
}

void DeviceMemory::reserve(int device) {
  if (CUresult r = heap(device).reserve(); r != CUDA_SUCCESS) {
    log::get("daemon")->debug(
        "session {}: the range of device {} is not reserved yet (CUresult {})", session_, device,
        static_cast<int>(r));
  }
}

CUresult DeviceMemory::releaseRange(int device, CUdeviceptr address) {
  auto h = heaps_.find(device);
  return h == heaps_.end() ? CUDA_ERROR_INVALID_VALUE : h->second->free(address);
}

size_t DeviceMemory::mappedBytes(int device, CUdeviceptr address) const {
  auto h = heaps_.find(device);
  return h == heaps_.end() ? 0 : h->second->mappedBytes(address);
}

void DeviceMemory::clear() {
  allocations_.clear();
  heaps_.clear();  // unmaps and releases the session's device memory
}

std::vector<DeviceBuffer> DeviceMemory::buffers(const SessionContexts& contexts) const {
  std::vector<DeviceBuffer> found;
  for (const auto& [address, a] : allocations_) {
    if (a.module != nullptr) continue;
    const SessionContext* ctx = contexts.find(a.context);
    if (ctx == nullptr || ctx->real == nullptr) continue;
    found.push_back({0, address, a.bytes, ctx->real, ctx->device});
  }
  return found;
}

Status DeviceMemory::save(image::ImageWriter& writer, json& state,
                          std::vector<DeviceBuffer>& copies) const {
  json heaps = json::array();
  for (const auto& [device, heap] : heaps_)
    heaps.push_back({{"device", device}, {"base", heap->base()}});
  state["heaps"] = heaps;
  json allocations = json::array();
  for (const auto& [address, a] : allocations_) {
    if (a.module != nullptr) continue;  // a module's global: saved with its module
    std::string name = fmt::format("gpu/{}/{}", a.device, hex(address));
    ASSIGN_OR_RETURN(
        size_t blob,
        writer.addBlob(name, "gpu-memory", a.bytes,
                       {{"device", a.device}, {"address", address}, {"context", a.context}}));
    copies.push_back({blob, address, a.bytes, nullptr, a.device});
    allocations.push_back({{"address", address},
                           {"bytes", a.bytes},
                           {"device", a.device},
                           {"context", a.context},
                           {"pool", a.pool},
                           {"physical", a.physical},
                           {"blob", name},
                           {"order", a.order}});
  }
  state["allocations"] = allocations;
  return Status::ok();
}

DeviceMemory::Restore::Restore(DeviceMemory& memory, SessionScope& scope,
                               const image::ImageReader& reader, const json& state)
    : memory_(memory),
      scope_(scope),
      reader_(reader),
      heaps_(state.value("heaps", json::array())),
      allocations_(state.value("allocations", json::array())) {
  // Images without the order: allocations first.
  for (const json& a : allocations_) byOrder_.push_back(&a);
  std::stable_sort(byOrder_.begin(), byOrder_.end(), [](const json* x, const json* y) {
    return x->value("order", uint64_t{0}) < y->value("order", uint64_t{0});
  });
}

// NVIDIA's driver chooses where a module's variables go from what the
// process did before it loaded the module. The session reserved its ranges
// before its first module (reserve) and made the driver
// allocations of its own (a restore's staging) later: so here, the ranges
// first, then the allocations and modules in the job's order, then every copy.
Status DeviceMemory::Restore::reserveRanges() {
  for (const json& h : heaps_) {
    ASSIGN_OR_RETURN(int device, field<int>(h, "device", "heap"));
    ASSIGN_OR_RETURN(bases_[device], field<uint64_t>(h, "base", "heap"));
  }
  const DriverTable& d = scope_.driver;
  for (const auto& [device, base] : bases_) {
    CUcontext in = scope_.contexts.on(device, 0);
    if (in == nullptr) continue;  // no context on it now: reserved with its first allocation
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, CtxSetCurrent)(in), "making a context current"));
    auto& heap = memory_.heaps_[device];
    heap = std::make_unique<DeviceHeap>(d, device, base, true);
    if (CUresult r = heap->reserve(); r != CUDA_SUCCESS) {
      return makeError(Code::kFailedPrecondition,
                       "cannot reserve the range of device {} at {} again (CUresult {})", device,
                       hex(base), static_cast<int>(r));
    }
  }
  return Status::ok();
}

Result<DeviceHeap*> DeviceMemory::Restore::heapOf(int device, CUdeviceptr address) {
  auto& heap = memory_.heaps_[device];
  if (heap == nullptr) {
    auto base = bases_.find(device);
    if (base == bases_.end()) {
      memory_.heaps_.erase(device);
      return makeError(Code::kDataLoss,
                       "allocation {} is on device {}, whose range the image does not name",
                       hex(address), device);
    }
    heap = std::make_unique<DeviceHeap>(scope_.driver, device, base->second, true);
  }
  return heap.get();
}

Status DeviceMemory::Restore::mapBefore(uint64_t limit, const Mapped& mapped) {
  for (; next_ < byOrder_.size() && byOrder_[next_]->value("order", uint64_t{0}) < limit; ++next_) {
    const json& a = *byOrder_[next_];
    Allocation allocation;
    allocation.order = a.value("order", uint64_t{0});
    noteOrder(allocation.order);
    ASSIGN_OR_RETURN(allocation.address, field<uint64_t>(a, "address", "allocation"));
    ASSIGN_OR_RETURN(allocation.bytes, field<uint64_t>(a, "bytes", "allocation"));
    ASSIGN_OR_RETURN(allocation.device, field<int>(a, "device", "allocation"));
    ASSIGN_OR_RETURN(allocation.context, field<uint64_t>(a, "context", "allocation"));
    allocation.pool = a.value("pool", uint64_t{0});
    allocation.physical = a.value("physical", uint64_t{0});
    ASSIGN_OR_RETURN(size_t blob, blobOf(reader_, a, "allocation"));
    if (reader_.manifest().blobs[blob].size != allocation.bytes) {
      return makeError(Code::kDataLoss, "allocation {} is {} bytes, its blob {}",
                       hex(allocation.address), allocation.bytes,
                       reader_.manifest().blobs[blob].size);
    }
    RETURN_IF_ERROR(scope_.contexts.makeCurrent(scope_.driver, allocation.context));
    if (allocation.physical != 0) {
      // The application's VMM mapping, made again by ApplicationVmm::rebuild.
      if (!mappedAgain_ || !mappedAgain_(allocation)) {
        return makeError(
            Code::kDataLoss,
            "allocation {} is a mapping of VMM handle {}, which the image does not map",
            hex(allocation.address), allocation.physical);
      }
    } else {
      ASSIGN_OR_RETURN(DeviceHeap * heap, heapOf(allocation.device, allocation.address));
      if (CUresult r = heap->allocateAt(allocation.address, allocation.bytes); r != CUDA_SUCCESS) {
        return makeError(
            Code::kFailedPrecondition, "cannot map {} bytes of device {} at {} again (CUresult {})",
            allocation.bytes, allocation.device, hex(allocation.address), static_cast<int>(r));
      }
    }
    memory_.allocations_[allocation.address] = allocation;
    RETURN_IF_ERROR(mapped(allocation, blob));
  }
  return Status::ok();
}

}  // namespace phos::daemon
