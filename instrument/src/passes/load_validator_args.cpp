// SPDX-License-Identifier: Apache-2.0
// Pass 4: declares the validator registers in every twin and loads the three
// validator parameters into them, ahead of the original body.
#include <iterator>
#include <vector>

#include "passes.h"

namespace phos::instrument::passes::load_validator_args {
namespace {

using ptx::Mod;
using ptx::Opcode;
using ptx::Operand;
using ptx::StateSpace;
using ptx::Type;

ptx::Statement loadParam(std::string_view reg, std::string_view param, Type type) {
  return {ptx::makeInstruction(
      Opcode::kLd, {Mod::of(StateSpace::kParam), Mod::of(type)},
      {Operand::reg(std::string(reg)), Operand::addrSymbol(std::string(param))})};
}

}  // namespace

Status run(TwinContext& context) {
  for (TwinFunction& t : context.twins) {
    std::vector<ptx::Statement> prologue = {
        {makeDecl(StateSpace::kReg, kRangesReg, Type::kB64)},
        {makeDecl(StateSpace::kReg, kRangeCountReg, Type::kB32)},
        {makeDecl(StateSpace::kReg, kReportReg, Type::kB64)},
        {makeDecl(StateSpace::kReg, kAddressReg, Type::kB64)},
        {makeDecl(StateSpace::kReg, kSizeReg, Type::kB32)},
        loadParam(kRangesReg, kRangesParam, Type::kU64),
        loadParam(kRangeCountReg, kRangeCountParam, Type::kU32),
        loadParam(kReportReg, kReportParam, Type::kU64),
    };
    auto& body = t.twin.body;
    body.insert(body.begin(), std::make_move_iterator(prologue.begin()),
                std::make_move_iterator(prologue.end()));
  }
  return Status::ok();
}

}  // namespace phos::instrument::passes::load_validator_args
