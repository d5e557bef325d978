// SPDX-License-Identifier: Apache-2.0
// Module globals by image kind.
#include "session/module_globals.h"

#include <cstring>
#include <span>
#include <string_view>
#include <variant>

#include "phos/common/fatbin.h"
#include "phos/ptx/parser.h"

namespace phos::daemon {
namespace {

Result<std::vector<std::string>> ptxGlobals(std::string_view text) {
  ASSIGN_OR_RETURN(ptx::Module module, ptx::parseModule(text, "module image"));
  std::vector<std::string> names;
  for (const auto& item : module.items) {
    const auto* var = std::get_if<ptx::VarDecl>(&item);
    if (var == nullptr || var->linkage == ptx::Linkage::kExtern) continue;
    if (var->space != ptx::StateSpace::kGlobal && var->space != ptx::StateSpace::kConst) continue;
    names.push_back(var->name);
  }
  return names;
}

}  // namespace

bool isStringLiteral(std::string_view name) {
  auto numbered = [](std::string_view digits) {
    return !digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos;
  };
  if (name == "$str") return true;
  if (name.starts_with("$str$")) return numbered(name.substr(5));
  return name.starts_with("__unnamed_") && numbered(name.substr(10));
}

Result<std::vector<std::string>> moduleGlobalNames(const std::vector<char>& image) {
  const auto bytes = std::as_bytes(std::span(image));
  if (fatbin::isFatbin(bytes)) {
    ASSIGN_OR_RETURN(auto entries, fatbin::parse(bytes));
    // Every entry comes from the same source: the newest PTX names the
    // globals; without PTX, a cubin's symbol table does.
    const fatbin::Entry* ptx = nullptr;
    const fatbin::Entry* elf = nullptr;
    for (const fatbin::Entry& e : entries) {
      if (e.kind == fatbin::Entry::Kind::kPtx && (ptx == nullptr || e.arch > ptx->arch)) ptx = &e;
      if (e.kind == fatbin::Entry::Kind::kElf && elf == nullptr) elf = &e;
    }
    if (ptx != nullptr) {
      ASSIGN_OR_RETURN(std::string text, fatbin::contents(*ptx));
      return ptxGlobals(std::string_view(text.data(), strnlen(text.data(), text.size())));
    }
    if (elf != nullptr) {
      ASSIGN_OR_RETURN(std::string cubin, fatbin::contents(*elf));
      return fatbin::cubinGlobals(std::as_bytes(std::span(cubin)));
    }
    return std::vector<std::string>{};
  }
  if (fatbin::isCubin(bytes)) return fatbin::cubinGlobals(bytes);
  return ptxGlobals(std::string_view(image.data(), strnlen(image.data(), image.size())));
}

}  // namespace phos::daemon
