// SPDX-License-Identifier: Apache-2.0
// Name resolution over a parsed function, for executors and passes: a flat instruction
// sequence with resolved branch targets, and the registers each nested scope declares.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "phos/common/status.h"
#include "phos/ptx/ast.h"

namespace phos::ptx {

// Predefined, read-only special registers (%tid, %laneid, %clock64, %envreg3, ...).
// `type` is the type of one component: %tid.x is .u32; %clock64 is .u64.
struct SpecialRegister {
  Type type = Type::kNone;
  bool hasComponents = false;  // %tid.x / %ntid.y / %ctaid.z / %cluster_ctaid.x ...
};
// The special register named `name` (with its '%', without a component), if it is one.
std::optional<SpecialRegister> specialRegister(std::string_view name);

// One { } scope of a function body. Scope 0 is the body itself and also holds the
// function's parameters and return parameters.
struct ScopeInfo {
  int32_t parent = -1;  // enclosing scope; -1 for scope 0
  // Registers and variables declared directly in this scope, in source order.
  std::vector<const VarDecl*> decls;
};

// One instruction of the flattened body.
struct FlatInstruction {
  const Instruction* inst = nullptr;
  uint32_t scope = 0;  // the innermost { } it appears in
  // For bra (and any instruction whose operand is a label of this function): the
  // index in instructions() of the first instruction after the label; equal to
  // instructions().size() for a label at the very end. -1 when there is none.
  int32_t target = -1;
  const LocDirective* loc = nullptr;  // the last .loc before it, if any
};

// A read-only view of one function, valid while the Function it was built from is
// neither moved nor modified. Nested blocks are flattened in source order: on a GPU a
// block opens no new control flow, only a new naming scope.
class ResolvedFunction {
 public:
  // Fails with kInvalidArgument (naming function and label) when a label is
  // defined twice in one scope, or an instruction names a label, register or
  // variable that is declared nowhere visible (module variables are looked up in
  // `module` when given; functions are always accepted as call targets there).
  static Result<ResolvedFunction> build(const Function& function,
                                        const Module* module = nullptr);

  const Function& function() const { return *function_; }
  const std::vector<FlatInstruction>& instructions() const { return instructions_; }
  const std::vector<ScopeInfo>& scopes() const { return scopes_; }

  // The declaration `name` refers to from `scope`, innermost scope first: an exact
  // name (variable, parameter, scalar register) or a member of a register range
  // ("%r7" of ".reg .b32 %r<12>"). nullptr if none.
  const VarDecl* findDecl(std::string_view name, uint32_t scope) const;

  // Index of the instruction following `label` as seen from `scope`.
  std::optional<uint32_t> labelTarget(std::string_view label, uint32_t scope) const;

  // Every label of the function and where it points, in source order.
  const std::vector<std::pair<std::string, uint32_t>>& labels() const { return labelList_; }

 private:
  struct ScopeNames {
    std::unordered_map<std::string_view, const VarDecl*> exact;
    std::unordered_map<std::string_view, const VarDecl*> ranges;  // by prefix ("%rd")
    std::unordered_map<std::string_view, uint32_t> labels;
  };

  const Function* function_ = nullptr;
  std::vector<FlatInstruction> instructions_;
  std::vector<ScopeInfo> scopes_;
  std::vector<ScopeNames> names_;
  std::vector<std::pair<std::string, uint32_t>> labelList_;
};

// Bytes of a module variable's initializer, little-endian as the GPU stores them:
// each scalar converted to the declared element type (0d literals to .f32 and back,
// integers truncated), nested braces flattened in order, the rest zero-filled up to
// byteSize(). A symbol (a variable's address, generic(sym)+off) is asked of
// `addressOf`; symbols are only valid in 32- or 64-bit elements.
using AddressResolver = std::function<Result<uint64_t>(std::string_view symbol)>;
Result<std::vector<uint8_t>> encodeInitializer(const VarDecl& decl,
                                               const AddressResolver& addressOf = {});

}  // namespace phos::ptx
