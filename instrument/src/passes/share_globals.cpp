// SPDX-License-Identifier: Apache-2.0
// Pass 6: the twin module is loaded beside the original and must use the
// original's .global and .const variables, not copies of its own (a __device__
// pointer one kernel sets and another uses, a counter, __constant__ tables).
// Every reference to one becomes a load of its address from the table
// kGlobalTable, which the loader fills with what cuModuleGetGlobal gives for the
// variable in the original module.
//
// Addresses of the original's variables are device addresses in the global
// window, so in the twin module a .const variable is read where it lives, with
// global-space instructions: `ld.const` becomes `ld.global`, `cvta.const`
// `cvta.global`, and a "const-space address" in a register is a global-space
// address of the original's constant data. That is consistent because every
// const-space address a twin can form comes from one of the original's
// variables (the twin module has no .const variable of its own but the table).
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "passes.h"

namespace phos::instrument::passes::share_globals {
namespace {

using ptx::Instruction;
using ptx::Mod;
using ptx::Opcode;
using ptx::Operand;
using ptx::OperandKind;
using ptx::StateSpace;
using ptx::Type;

bool isSharedVariable(const ptx::VarDecl& d) {
  return d.space == StateSpace::kGlobal || d.space == StateSpace::kConst;
}

// Whether `inst` addresses memory without a state space (generic addressing):
// a variable named in it stands for its generic address.
bool isGeneric(const Instruction& inst) {
  for (const Mod& m : inst.mods) {
    if (m.kind == Mod::Kind::kSpace) return false;
  }
  return true;
}

class Redirector {
 public:
  explicit Redirector(const ptx::Module& original, std::vector<std::string>& slots) : slots_(slots) {
    for (const ptx::ModuleItem& item : original.items) {
      if (const auto* v = std::get_if<ptx::VarDecl>(&item); v && isSharedVariable(*v)) variables_.insert(v->name);
    }
  }

  Status run(ptx::Function& f) {
    registers_ = 0;
    std::vector<std::unordered_set<std::string>> scopes(1);
    for (const ptx::VarDecl& p : f.params) scopes.back().insert(p.name);
    for (const ptx::VarDecl& p : f.returnParams) scopes.back().insert(p.name);
    RETURN_IF_ERROR(rewrite(f.body, scopes));
    if (registers_ > 0) {
      ptx::VarDecl regs = makeDecl(StateSpace::kReg, kGlobalAddressReg, Type::kB64);
      regs.rangeCount = registers_;
      f.body.insert(f.body.begin(), ptx::Statement{std::move(regs)});
    }
    return Status::ok();
  }

 private:
  // The instructions of one rewritten statement: loads of table entries first.
  struct Site {
    std::vector<ptx::Statement> before;
  };

  Status rewrite(std::vector<ptx::Statement>& body, std::vector<std::unordered_set<std::string>>& scopes) {
    scopes.emplace_back();
    for (const ptx::Statement& s : body) {
      if (const auto* d = std::get_if<ptx::VarDecl>(&s.value)) scopes.back().insert(d->name);
    }
    std::vector<ptx::Statement> out;
    out.reserve(body.size());
    for (ptx::Statement& s : body) {
      if (auto* block = std::get_if<ptx::Block>(&s.value)) {
        RETURN_IF_ERROR(rewrite(block->statements, scopes));
      } else if (auto* inst = std::get_if<Instruction>(&s.value)) {
        Site site;
        RETURN_IF_ERROR(rewrite(*inst, scopes, site));
        for (ptx::Statement& b : site.before) out.push_back(std::move(b));
      }
      out.push_back(std::move(s));
    }
    body = std::move(out);
    scopes.pop_back();
    return Status::ok();
  }

  // Whether `name` is one of the original's .global/.const variables here (a
  // local declaration or parameter of that name hides it).
  bool isOriginalVariable(const std::string& name, const std::vector<std::unordered_set<std::string>>& scopes) const {
    if (!variables_.count(name)) return false;
    for (const auto& scope : scopes) {
      if (scope.count(name)) return false;
    }
    return true;
  }

  Status rewrite(Instruction& inst, const std::vector<std::unordered_set<std::string>>& scopes, Site& site) {
    bool changed = moveConstToGlobal(inst);
    const bool generic = isGeneric(inst);
    for (Operand& o : inst.operands) {
      if (o.kind == OperandKind::kAddress && o.addressIsSymbol && isOriginalVariable(o.name, scopes)) {
        // [var+offset]: the same offset from a register holding var's address.
        std::string reg = addressOf(o.name, 0, !generic, site);
        o = Operand::addrReg(std::move(reg), o.value);
        changed = true;
      } else if (o.kind == OperandKind::kSymbol && isOriginalVariable(o.name, scopes)) {
        if (inst.opcode == Opcode::kCvta) {
          // cvta.global/.const of a variable: its generic address, which is what
          // the table holds.
          std::string reg = addressOf(o.name, o.value, false, site);
          inst = ptx::makeInstruction(Opcode::kMov, {Mod::of(inst.m.type())}, {inst.operands[0], Operand::reg(reg)},
                                      inst.guard);
          return Status::ok();
        }
        // mov %r, var: the address in var's own state space.
        o = Operand::reg(addressOf(o.name, o.value, true, site));
        changed = true;
      } else if (o.kind == OperandKind::kVector || o.kind == OperandKind::kList) {
        for (Operand& e : o.elements) {
          if (e.kind == OperandKind::kSymbol && isOriginalVariable(e.name, scopes)) {
            e = Operand::reg(addressOf(e.name, e.value, true, site));
            changed = true;
          }
        }
      }
    }
    if (changed) inst = ptx::makeInstruction(inst.opcode, inst.mods, std::move(inst.operands), inst.guard);
    return Status::ok();
  }

  // const-space instructions address the original's constant data through
  // global-space addresses (see the top of this file). isspacep keeps its
  // space: it asks about a generic address, which stays what it was.
  static bool moveConstToGlobal(Instruction& inst) {
    if (inst.opcode == Opcode::kIsspacep) return false;
    bool changed = false;
    for (Mod& m : inst.mods) {
      if (m.kind == Mod::Kind::kSpace && m.value == static_cast<uint16_t>(StateSpace::kConst)) {
        m = Mod::of(StateSpace::kGlobal);
        changed = true;
      }
    }
    return changed;
  }

  // Emits, into `site`, the loading of `name`'s address (+ offset) into a fresh
  // register: generic (what the table holds) or, with `globalSpace`, converted
  // to the global state space. Returns the register.
  std::string addressOf(const std::string& name, int64_t offset, bool globalSpace, Site& site) {
    const std::string reg = std::string(kGlobalAddressReg) + std::to_string(registers_++);
    site.before.push_back({ptx::makeInstruction(
        Opcode::kLd, {Mod::of(StateSpace::kConst), Mod::of(Type::kU64)},
        {Operand::reg(reg), Operand::addrSymbol(std::string(kGlobalTable), 8 * static_cast<int64_t>(slotOf(name)))})});
    if (globalSpace) {
      site.before.push_back({ptx::makeInstruction(Opcode::kCvta, {Mod::of(ptx::Flag::kTo), Mod::of(StateSpace::kGlobal),
                                                                   Mod::of(Type::kU64)},
                                                  {Operand::reg(reg), Operand::reg(reg)})});
    }
    if (offset != 0) {
      site.before.push_back({ptx::makeInstruction(Opcode::kAdd, {Mod::of(Type::kS64)},
                                                  {Operand::reg(reg), Operand::reg(reg), Operand::imm(offset)})});
    }
    return reg;
  }

  uint32_t slotOf(const std::string& name) {
    auto [it, added] = slotIndex_.emplace(name, static_cast<uint32_t>(slots_.size()));
    if (added) slots_.push_back(name);
    return it->second;
  }

  std::unordered_set<std::string> variables_;
  std::unordered_map<std::string, uint32_t> slotIndex_;
  std::vector<std::string>& slots_;
  uint32_t registers_ = 0;
};

ptx::VarDecl tableDeclaration(size_t slots) {
  ptx::VarDecl table = makeDecl(StateSpace::kConst, kGlobalTable, Type::kU64);
  table.align = 8;
  table.dims = {slots};
  return table;
}

}  // namespace

Status run(TwinContext& context) {
  std::vector<std::string> slots;
  Redirector redirector(*context.original, slots);
  for (ptx::ModuleItem& item : context.output.items) {
    auto* f = std::get_if<ptx::Function>(&item);
    if (f && f->hasBody) RETURN_IF_ERROR(redirector.run(*f));
  }
  if (!slots.empty()) {
    // Ahead of every function that reads it.
    context.output.items.insert(context.output.items.begin(), tableDeclaration(slots.size()));
  }
  context.stats.globals = std::move(slots);
  return Status::ok();
}

}  // namespace phos::instrument::passes::share_globals
