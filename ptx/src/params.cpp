// SPDX-License-Identifier: Apache-2.0
// Kernel parameter layout, computed the way the driver places launch arguments.
#include "phos/ptx/params.h"

namespace phos::ptx {

Result<ParamLayout> computeParamLayout(const Function& kernel) {
  ParamLayout layout;
  layout.kernel = kernel.name;
  uint64_t offset = 0;
  for (size_t i = 0; i < kernel.params.size(); ++i) {
    const VarDecl& p = kernel.params[i];
    uint64_t size = p.byteSize();
    if (size == 0) {
      return makeError(Code::kInvalidArgument, "kernel {}: parameter {} ('{}') has no size",
                       kernel.name, i, p.name);
    }
    // The PTX ISA: "the alignment of a kernel parameter defaults to the natural
    // alignment of its type" unless .align is given; .b8 arrays (structs passed by
    // value) therefore carry an explicit .align from the front end.
    uint64_t align = p.align ? p.align : uint64_t{typeSize(p.type)} * p.vectorWidth;
    if (align == 0) align = 1;
    offset = (offset + align - 1) / align * align;
    if (offset + size > 0xFFFFFFFFull) {
      return makeError(Code::kOutOfRange, "kernel {}: parameters exceed 4 GiB", kernel.name);
    }
    ParamInfo info;
    info.ordinal = static_cast<uint32_t>(i);
    info.name = p.name;
    info.offset = static_cast<uint32_t>(offset);
    info.size = static_cast<uint32_t>(size);
    info.alignment = static_cast<uint32_t>(align);
    info.type = p.type;
    info.isPtr = p.isPtr;
    info.mayBePointer =
        p.isPtr || (p.dims.empty() && p.vectorWidth == 1 && typeSize(p.type) == 8 &&
                    !isFloatType(p.type));
    layout.params.push_back(std::move(info));
    offset += size;
  }
  layout.totalSize = static_cast<uint32_t>(offset);
  return layout;
}

Result<std::vector<ParamLayout>> computeParamLayouts(const Module& module) {
  std::vector<ParamLayout> out;
  for (const ModuleItem& item : module.items) {
    const auto* f = std::get_if<Function>(&item);
    if (!f || !f->isEntry) continue;
    ASSIGN_OR_RETURN(ParamLayout l, computeParamLayout(*f));
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace phos::ptx
