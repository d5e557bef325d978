// SPDX-License-Identifier: Apache-2.0
// Scopes, registers and labels of a function resolved once, and initializer bytes.
#include "phos/ptx/resolve.h"

#include <charconv>
#include <cstring>

#include <fmt/format.h>

namespace phos::ptx {
namespace {

// Splits "%rd12" into ("%rd", 12); nullopt when the name has no numeric suffix.
std::optional<std::pair<std::string_view, uint64_t>> splitIndexed(std::string_view name) {
  size_t end = name.size();
  size_t start = end;
  while (start > 0 && name[start - 1] >= '0' && name[start - 1] <= '9') --start;
  if (start == end || start == 0) return std::nullopt;
  uint64_t index = 0;
  auto [p, ec] = std::from_chars(name.data() + start, name.data() + end, index);
  if (ec != std::errc() || p != name.data() + end) return std::nullopt;
  return std::make_pair(name.substr(0, start), index);
}

bool startsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// The label a RawDirective defines ("prototype_0 : .callprototype ..."), if any.
std::string_view rawDirectiveLabel(const RawDirective& raw) {
  size_t colon = raw.text.find(':');
  if (colon == std::string::npos) return {};
  std::string_view label = std::string_view(raw.text).substr(0, colon);
  while (!label.empty() && label.back() == ' ') label.remove_suffix(1);
  return label;
}

}  // namespace

std::optional<SpecialRegister> specialRegister(std::string_view name) {
  struct Entry {
    std::string_view name;
    SpecialRegister reg;
  };
  // PTX ISA, "Special Registers". Vector registers (.v4 .u32) read one component.
  static constexpr Entry kFixed[] = {
      {"%tid", {Type::kU32, true}},
      {"%ntid", {Type::kU32, true}},
      {"%ctaid", {Type::kU32, true}},
      {"%nctaid", {Type::kU32, true}},
      {"%clusterid", {Type::kU32, true}},
      {"%nclusterid", {Type::kU32, true}},
      {"%cluster_ctaid", {Type::kU32, true}},
      {"%cluster_nctaid", {Type::kU32, true}},
      {"%laneid", {Type::kU32, false}},
      {"%warpid", {Type::kU32, false}},
      {"%nwarpid", {Type::kU32, false}},
      {"%smid", {Type::kU32, false}},
      {"%nsmid", {Type::kU32, false}},
      {"%gridid", {Type::kU64, false}},
      {"%is_explicit_cluster", {Type::kPred, false}},
      {"%cluster_ctarank", {Type::kU32, false}},
      {"%cluster_nctarank", {Type::kU32, false}},
      {"%lanemask_eq", {Type::kU32, false}},
      {"%lanemask_le", {Type::kU32, false}},
      {"%lanemask_lt", {Type::kU32, false}},
      {"%lanemask_ge", {Type::kU32, false}},
      {"%lanemask_gt", {Type::kU32, false}},
      {"%clock", {Type::kU32, false}},
      {"%clock_hi", {Type::kU32, false}},
      {"%clock64", {Type::kU64, false}},
      {"%globaltimer", {Type::kU64, false}},
      {"%globaltimer_lo", {Type::kU32, false}},
      {"%globaltimer_hi", {Type::kU32, false}},
      {"%total_smem_size", {Type::kU32, false}},
      {"%aggr_smem_size", {Type::kU32, false}},
      {"%dynamic_smem_size", {Type::kU32, false}},
      {"%reserved_smem_offset_begin", {Type::kB32, false}},
      {"%reserved_smem_offset_end", {Type::kB32, false}},
      {"%reserved_smem_offset_cap", {Type::kB32, false}},
      {"%current_graph_exec", {Type::kU64, false}},
  };
  for (const Entry& e : kFixed) {
    if (e.name == name) return e.reg;
  }
  // Numbered families: %envreg0..31, %pm0..7, %pm0_64..%pm7_64,
  // %reserved_smem_offset_0..1.
  if (auto split = splitIndexed(name)) {
    auto [prefix, index] = *split;
    if (prefix == "%envreg" && index < 32) return SpecialRegister{Type::kB32, false};
    if (prefix == "%pm" && index < 8) return SpecialRegister{Type::kU32, false};
    if (prefix == "%reserved_smem_offset_" && index < 2) {
      return SpecialRegister{Type::kB32, false};
    }
    if (startsWith(name, "%pm") && prefix.size() > 4 && prefix.substr(prefix.size() - 1) == "_" &&
        index == 64) {
      return SpecialRegister{Type::kU64, false};
    }
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// ResolvedFunction
// ---------------------------------------------------------------------------

namespace {

class Resolver {
 public:
  explicit Resolver(const Function& f) : f_(f) {}

  // First pass: scopes, declarations, labels, flat instructions.
  Status collect(const std::vector<Statement>& body, uint32_t scope,
                 std::vector<FlatInstruction>& out, std::vector<ScopeInfo>& scopes,
                 std::vector<std::pair<std::string, uint32_t>>& labelList,
                 std::vector<std::unordered_map<std::string_view, const VarDecl*>>& exact,
                 std::vector<std::unordered_map<std::string_view, const VarDecl*>>& ranges,
                 std::vector<std::unordered_map<std::string_view, uint32_t>>& labels) {
    for (const Statement& s : body) {
      if (const auto* inst = std::get_if<Instruction>(&s.value)) {
        FlatInstruction fi;
        fi.inst = inst;
        fi.scope = scope;
        fi.loc = lastLoc_;
        out.push_back(fi);
      } else if (const auto* label = std::get_if<Label>(&s.value)) {
        RETURN_IF_ERROR(addLabel(label->name, scope, static_cast<uint32_t>(out.size()),
                                 labelList, labels));
      } else if (const auto* raw = std::get_if<RawDirective>(&s.value)) {
        std::string_view l = rawDirectiveLabel(*raw);
        if (!l.empty()) {
          RETURN_IF_ERROR(addLabel(l, scope, static_cast<uint32_t>(out.size()), labelList,
                                   labels));
        }
      } else if (const auto* decl = std::get_if<VarDecl>(&s.value)) {
        addDecl(*decl, scope, scopes, exact, ranges);
      } else if (const auto* loc = std::get_if<LocDirective>(&s.value)) {
        lastLoc_ = loc;
      } else if (const auto* block = std::get_if<Block>(&s.value)) {
        auto inner = static_cast<uint32_t>(scopes.size());
        scopes.push_back(ScopeInfo{static_cast<int32_t>(scope), {}});
        exact.emplace_back();
        ranges.emplace_back();
        labels.emplace_back();
        RETURN_IF_ERROR(
            collect(block->statements, inner, out, scopes, labelList, exact, ranges, labels));
      }
    }
    return Status::ok();
  }

  static void addDecl(const VarDecl& d, uint32_t scope, std::vector<ScopeInfo>& scopes,
                      std::vector<std::unordered_map<std::string_view, const VarDecl*>>& exact,
                      std::vector<std::unordered_map<std::string_view, const VarDecl*>>& ranges) {
    scopes[scope].decls.push_back(&d);
    if (d.rangeCount > 0) {
      ranges[scope][d.name] = &d;
    } else {
      exact[scope][d.name] = &d;
    }
  }

 private:
  Status addLabel(std::string_view name, uint32_t scope, uint32_t index,
                  std::vector<std::pair<std::string, uint32_t>>& labelList,
                  std::vector<std::unordered_map<std::string_view, uint32_t>>& labels) {
    if (!labels[scope].emplace(name, index).second) {
      return makeError(Code::kInvalidArgument, "function {}: label {} is defined twice",
                       f_.name, name);
    }
    labelList.emplace_back(std::string(name), index);
    return Status::ok();
  }

  const Function& f_;
  const LocDirective* lastLoc_ = nullptr;
};

}  // namespace

Result<ResolvedFunction> ResolvedFunction::build(const Function& function, const Module* module) {
  ResolvedFunction r;
  r.function_ = &function;
  r.scopes_.push_back(ScopeInfo{});
  std::vector<std::unordered_map<std::string_view, const VarDecl*>> exact(1);
  std::vector<std::unordered_map<std::string_view, const VarDecl*>> ranges(1);
  std::vector<std::unordered_map<std::string_view, uint32_t>> labels(1);
  for (const VarDecl& p : function.returnParams) {
    Resolver::addDecl(p, 0, r.scopes_, exact, ranges);
  }
  for (const VarDecl& p : function.params) Resolver::addDecl(p, 0, r.scopes_, exact, ranges);
  Resolver res(function);
  RETURN_IF_ERROR(res.collect(function.body, 0, r.instructions_, r.scopes_, r.labelList_, exact,
                              ranges, labels));
  r.names_.resize(r.scopes_.size());
  for (size_t i = 0; i < r.scopes_.size(); ++i) {
    r.names_[i].exact = std::move(exact[i]);
    r.names_[i].ranges = std::move(ranges[i]);
    r.names_[i].labels = std::move(labels[i]);
  }

  // Second pass: resolve and check every name an instruction uses.
  auto symbolKnown = [&](std::string_view name, uint32_t scope) {
    if (r.findDecl(name, scope) || r.labelTarget(name, scope)) return true;
    if (!module) return true;  // module symbols cannot be checked without the module
    if (module->findFunction(name) || module->findVariable(name)) return true;
    return false;
  };
  auto registerKnown = [&](std::string_view name, uint32_t scope) {
    return specialRegister(name).has_value() || r.findDecl(name, scope) != nullptr;
  };
  for (size_t i = 0; i < r.instructions_.size(); ++i) {
    FlatInstruction& fi = r.instructions_[i];
    const Instruction& inst = *fi.inst;
    auto fail = [&](std::string_view what, std::string_view name) -> Status {
      return makeError(Code::kInvalidArgument, "function {}: line {}: {} {} is not declared",
                       function.name, inst.line, what, name);
    };
    if (inst.guard.present() && !registerKnown(inst.guard.reg, fi.scope)) {
      return fail("predicate", inst.guard.reg);
    }
    // Depth-first over operands, with an explicit stack (operands nest only a few
    // levels, but the parser's limit is the only bound).
    std::vector<const Operand*> stack;
    for (auto it = inst.operands.rbegin(); it != inst.operands.rend(); ++it) stack.push_back(&*it);
    while (!stack.empty()) {
      const Operand* o = stack.back();
      stack.pop_back();
      switch (o->kind) {
        case OperandKind::kRegister:
          if (!registerKnown(o->name, fi.scope)) return fail("register", o->name);
          break;
        case OperandKind::kAddress:
          for (auto it = o->elements.rbegin(); it != o->elements.rend(); ++it) {
            stack.push_back(&*it);
          }
          if (o->name.empty()) break;
          if (o->addressIsSymbol ? !symbolKnown(o->name, fi.scope)
                                 : !registerKnown(o->name, fi.scope)) {
            return fail(o->addressIsSymbol ? "variable" : "register", o->name);
          }
          break;
        case OperandKind::kSymbol:
          if (auto t = r.labelTarget(o->name, fi.scope)) {
            if (fi.target < 0) fi.target = static_cast<int32_t>(*t);
          } else if (!symbolKnown(o->name, fi.scope)) {
            return fail(inst.opcode == Opcode::kBra ? "label" : "symbol", o->name);
          }
          break;
        case OperandKind::kVector:
        case OperandKind::kList:
        case OperandKind::kPredPair:
          for (auto it = o->elements.rbegin(); it != o->elements.rend(); ++it) {
            stack.push_back(&*it);
          }
          break;
        default:
          break;
      }
    }
  }
  return r;
}

const VarDecl* ResolvedFunction::findDecl(std::string_view name, uint32_t scope) const {
  std::optional<std::pair<std::string_view, uint64_t>> split;
  bool splitDone = false;
  for (int64_t s = scope; s >= 0 && static_cast<size_t>(s) < names_.size();
       s = scopes_[static_cast<size_t>(s)].parent) {
    const ScopeNames& n = names_[static_cast<size_t>(s)];
    if (auto it = n.exact.find(name); it != n.exact.end()) return it->second;
    if (n.ranges.empty()) continue;
    if (!splitDone) {
      split = splitIndexed(name);
      splitDone = true;
    }
    if (!split) continue;
    if (auto it = n.ranges.find(split->first);
        it != n.ranges.end() && split->second < it->second->rangeCount) {
      return it->second;
    }
  }
  return nullptr;
}

std::optional<uint32_t> ResolvedFunction::labelTarget(std::string_view label,
                                                      uint32_t scope) const {
  for (int64_t s = scope; s >= 0 && static_cast<size_t>(s) < names_.size();
       s = scopes_[static_cast<size_t>(s)].parent) {
    const ScopeNames& n = names_[static_cast<size_t>(s)];
    if (auto it = n.labels.find(label); it != n.labels.end()) return it->second;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Initializers
// ---------------------------------------------------------------------------

namespace {

void storeLittleEndian(std::vector<uint8_t>& out, size_t at, uint64_t v, uint32_t size) {
  for (uint32_t b = 0; b < size; ++b) out[at + b] = static_cast<uint8_t>(v >> (8 * b));
}

Result<uint64_t> scalarBits(const VarDecl& d, const Operand& o, const AddressResolver& addressOf) {
  Type t = d.type;
  uint32_t size = typeSize(t);
  switch (o.kind) {
    case OperandKind::kImmInt:
      if (t == Type::kF32) {
        float f = static_cast<float>(o.value);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        return bits;
      }
      if (t == Type::kF64) {
        double f = static_cast<double>(o.value);
        uint64_t bits;
        std::memcpy(&bits, &f, 8);
        return bits;
      }
      return static_cast<uint64_t>(o.value);
    case OperandKind::kImmFloat: {
      if (t == Type::kF32) {
        if (o.floatWidth == 32) return o.floatBits & 0xFFFFFFFFu;
        double v;
        std::memcpy(&v, &o.floatBits, 8);
        float f = static_cast<float>(v);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        return bits;
      }
      if (t == Type::kF64) {
        if (o.floatWidth == 64) return o.floatBits;
        uint32_t b32 = static_cast<uint32_t>(o.floatBits);
        float f;
        std::memcpy(&f, &b32, 4);
        double v = f;
        uint64_t bits;
        std::memcpy(&bits, &v, 8);
        return bits;
      }
      // A hex float literal names bits; for .b32/.b64 elements keep them as written.
      if (isBitType(t) && size * 8 == o.floatWidth) return o.floatBits;
      return makeError(Code::kNotSupported,
                       "initializer of {}: a floating-point literal for a .{} element", d.name,
                       name(t));
    }
    case OperandKind::kSymbol: {
      if (size != 4 && size != 8) {
        return makeError(Code::kInvalidArgument,
                         "initializer of {}: the address of {} does not fit a .{} element",
                         d.name, o.name, name(t));
      }
      if (!addressOf) {
        return makeError(Code::kFailedPrecondition,
                         "initializer of {}: the address of {} is needed but no resolver was given",
                         d.name, o.name);
      }
      ASSIGN_OR_RETURN(uint64_t base, addressOf(o.name));
      return base + static_cast<uint64_t>(o.value);
    }
    default:
      return makeError(Code::kInvalidArgument, "initializer of {}: unexpected operand", d.name);
  }
}

}  // namespace

Result<std::vector<uint8_t>> encodeInitializer(const VarDecl& decl,
                                               const AddressResolver& addressOf) {
  uint32_t elemSize = typeSize(decl.type);
  if (elemSize == 0) {
    return makeError(Code::kInvalidArgument, "variable {} has no sized type", decl.name);
  }
  // Flatten the initializer's scalars in order.
  std::vector<const Operand*> scalars;
  if (decl.init) {
    std::vector<const Operand*> stack{&*decl.init};
    while (!stack.empty()) {
      const Operand* o = stack.back();
      stack.pop_back();
      if (o->kind == OperandKind::kVector) {
        for (auto it = o->elements.rbegin(); it != o->elements.rend(); ++it) stack.push_back(&*it);
      } else {
        scalars.push_back(o);
      }
    }
  }
  uint64_t total = decl.byteSize();
  if (total == 0) total = uint64_t{elemSize} * scalars.size();  // x[] = {...}: sized by it
  if (uint64_t{elemSize} * scalars.size() > total) {
    return makeError(Code::kInvalidArgument,
                     "initializer of {} has {} elements; the variable holds {}", decl.name,
                     scalars.size(), total / elemSize);
  }
  if (total > (uint64_t{1} << 32)) {
    return makeError(Code::kOutOfRange, "variable {} of {} bytes is too large to initialize",
                     decl.name, total);
  }
  std::vector<uint8_t> out(static_cast<size_t>(total), 0);
  for (size_t i = 0; i < scalars.size(); ++i) {
    ASSIGN_OR_RETURN(uint64_t bits, scalarBits(decl, *scalars[i], addressOf));
    storeLittleEndian(out, i * elemSize, bits, elemSize);
  }
  return out;
}

}  // namespace phos::ptx
