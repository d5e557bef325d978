// SPDX-License-Identifier: Apache-2.0
// cuGetProcAddress's lookup over apigen's version map and vgpu's generated symbol table.
#include "proc_lookup.h"

#include <algorithm>
#include <string_view>

#include "phos/cuda_api/proc_address.h"
#include "unsupported.h"

namespace phos::vgpu::api {
namespace {

void* ownSymbol(std::string_view name) {
  const SymbolAddress* begin = kSymbolTable;
  const SymbolAddress* end = kSymbolTable + kSymbolTableSize;
  const SymbolAddress* it = std::lower_bound(
      begin, end, name, [](const SymbolAddress& s, std::string_view n) { return std::string_view(s.name) < n; });
  return (it != end && it->name == name) ? it->address : nullptr;
}

}  // namespace

ProcLookup lookupProcAddress(const char* symbol, int cudaVersion, std::uint64_t flags, void** pfn) {
  *pfn = nullptr;
  auto found = cuda_api::lookupProcAddress(symbol, cudaVersion, flags);
  switch (found.status) {
    case cuda_api::ProcAddressStatus::kSuccess:
      *pfn = ownSymbol(cuda_api::entryPoint(found.entry).symbol);
      return *pfn != nullptr ? ProcLookup::kSuccess : ProcLookup::kSymbolNotFound;
    case cuda_api::ProcAddressStatus::kVersionNotSufficient:
      return ProcLookup::kVersionNotSufficient;
    case cuda_api::ProcAddressStatus::kSymbolNotFound:
      break;
  }
  // A name cudaTypedefs.h does not version: the exported symbol of that exact name.
  *pfn = ownSymbol(symbol);
  return *pfn != nullptr ? ProcLookup::kSuccess : ProcLookup::kSymbolNotFound;
}

}  // namespace phos::vgpu::api
