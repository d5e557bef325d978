// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: any input must parse or fail with a Status, never crash or hang;
// whatever parses must print, re-parse and compare equal.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "phos/ptx/params.h"
#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"
#include "phos/ptx/resolve.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  phos::Result<phos::ptx::Module> mod = phos::ptx::parseModule(text, "fuzz");
  if (!mod.isOk()) return 0;
  (void)phos::ptx::computeParamLayouts(*mod);
  for (const phos::ptx::ModuleItem& item : mod->items) {
    if (const auto* f = std::get_if<phos::ptx::Function>(&item)) {
      (void)phos::ptx::ResolvedFunction::build(*f, &*mod);
    } else if (const auto* v = std::get_if<phos::ptx::VarDecl>(&item)) {
      // Bounded: a declared size alone must not make the fuzzer allocate gigabytes.
      if (v->byteSize() <= (1u << 20)) {
        (void)phos::ptx::encodeInitializer(
            *v, [](std::string_view) { return phos::Result<uint64_t>(uint64_t{0x1000}); });
      }
    }
  }
  std::string printed = phos::ptx::print(*mod);
  phos::Result<phos::ptx::Module> again = phos::ptx::parseModule(printed, "fuzz-printed");
  // The printer must emit what the parser reads, and nothing may change meaning.
  if (!again.isOk() || !(*again == *mod)) std::abort();
  return 0;
}
