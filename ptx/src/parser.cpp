// SPDX-License-Identifier: Apache-2.0
// Recursive-descent PTX parser producing the typed AST, with bounded nesting.
#include "phos/ptx/parser.h"

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>

#include "internal/lexer.h"

namespace phos::ptx {
namespace detail {
namespace {

// Spelling -> modifier. When a spelling belongs to several kinds the first kind
// registered wins here; opcode-dependent exceptions are applied in resolveMod().
class ModifierTable {
 public:
  ModifierTable() {
#define PHOS_PTX_ADD(id, text) add(text, Mod::of(E::id));
    {
      using E = Type;
      PHOS_PTX_TYPES(PHOS_PTX_ADD)
    }
    {
      using E = StateSpace;
      PHOS_PTX_SPACES(PHOS_PTX_ADD)
    }
    {
      using E = Rounding;
      PHOS_PTX_ROUNDINGS(PHOS_PTX_ADD)
    }
    {
      using E = CacheOp;
      PHOS_PTX_CACHEOPS(PHOS_PTX_ADD)
    }
    {
      using E = MemSem;
      PHOS_PTX_SEMS(PHOS_PTX_ADD)
    }
    {
      using E = Scope;
      PHOS_PTX_SCOPES(PHOS_PTX_ADD)
    }
    {
      using E = AtomOp;
      PHOS_PTX_ATOMOPS(PHOS_PTX_ADD)
    }
    {
      using E = CmpOp;
      PHOS_PTX_CMPOPS(PHOS_PTX_ADD)
    }
    {
      using E = Flag;
      PHOS_PTX_FLAGS(PHOS_PTX_ADD)
    }
#undef PHOS_PTX_ADD
#define PHOS_PTX_ADD_OPCODE(id, text) opcodes_.emplace(text, Opcode::id);
    PHOS_PTX_OPCODES(PHOS_PTX_ADD_OPCODE)
#undef PHOS_PTX_ADD_OPCODE
  }

  std::optional<Mod> find(std::string_view s) const {
    auto it = mods_.find(s);
    if (it != mods_.end()) return it->second;
    // .v2 / .v4 / .v8
    if (s.size() == 2 && s[0] == 'v' && (s[1] == '2' || s[1] == '4' || s[1] == '8')) {
      return Mod::vector(static_cast<uint8_t>(s[1] - '0'));
    }
    return std::nullopt;
  }

  Opcode opcode(std::string_view s) const {
    auto it = opcodes_.find(s);
    return it == opcodes_.end() ? Opcode::kNone : it->second;
  }

 private:
  void add(std::string_view s, Mod m) { mods_.emplace(s, m); }

  std::unordered_map<std::string_view, Mod> mods_;
  std::unordered_map<std::string_view, Opcode> opcodes_;
};

const ModifierTable& modifierTable() {
  static const ModifierTable table;
  return table;
}

bool comparesValues(Opcode op) {
  return op == Opcode::kSetp || op == Opcode::kSet || op == Opcode::kSlct ||
         op == Opcode::kVset || op == Opcode::kVset2 || op == Opcode::kVset4;
}

// Applies the opcode-dependent meaning of ambiguous spellings.
Mod resolveMod(Opcode op, Mod m) {
  if (m.kind == Mod::Kind::kCmp && !comparesValues(op)) {
    auto c = static_cast<CmpOp>(m.value);
    if (c == CmpOp::kLo) return Mod::of(Flag::kLo);
    if (c == CmpOp::kHi) return Mod::of(Flag::kHi);
  }
  if (m.kind == Mod::Kind::kAtom && (op == Opcode::kSetp || op == Opcode::kSet)) {
    switch (static_cast<AtomOp>(m.value)) {
      case AtomOp::kAnd: return Mod::of(BoolOp::kAnd);
      case AtomOp::kOr: return Mod::of(BoolOp::kOr);
      case AtomOp::kXor: return Mod::of(BoolOp::kXor);
      default: break;
    }
  }
  return m;
}

std::optional<Type> typeFromDot(std::string_view dotted) {
  auto m = modifierTable().find(dotted.substr(1));
  if (m && m->kind == Mod::Kind::kType) return static_cast<Type>(m->value);
  return std::nullopt;
}

std::optional<StateSpace> spaceFromDot(std::string_view dotted) {
  auto m = modifierTable().find(dotted.substr(1));
  if (m && m->kind == Mod::Kind::kSpace) return static_cast<StateSpace>(m->value);
  return std::nullopt;
}

std::optional<Linkage> linkageFromDot(std::string_view d) {
  if (d == ".visible") return Linkage::kVisible;
  if (d == ".extern") return Linkage::kExtern;
  if (d == ".weak") return Linkage::kWeak;
  if (d == ".common") return Linkage::kCommon;
  return std::nullopt;
}

std::optional<FunctionAttribute::Kind> attributeFromDot(std::string_view d) {
  using K = FunctionAttribute::Kind;
  static const std::unordered_map<std::string_view, K> kinds = {
      {".maxntid", K::kMaxNtid},
      {".reqntid", K::kReqNtid},
      {".minnctapersm", K::kMinNctaPerSm},
      {".maxnctapersm", K::kMaxNctaPerSm},
      {".maxnreg", K::kMaxNreg},
      {".noreturn", K::kNoReturn},
      {".maxclusterrank", K::kMaxClusterRank},
      {".reqnctapercluster", K::kReqNctaPerCluster},
      {".explicitcluster", K::kExplicitCluster},
      {".blocksareclusters", K::kBlocksAreClusters},
  };
  auto it = kinds.find(d);
  if (it == kinds.end()) return std::nullopt;
  return it->second;
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, std::string_view source, const ParseLimits& limits)
      : toks_(std::move(tokens)), source_(source), limits_(limits) {}

  Result<Module> module() {
    Module mod;
    while (peek().kind != TokenKind::kEnd) {
      RETURN_IF_ERROR(moduleItem(mod));
    }
    return mod;
  }

  Result<std::vector<Statement>> statements() {
    std::vector<Statement> out;
    while (peek().kind != TokenKind::kEnd) {
      RETURN_IF_ERROR(statement(out, 0));
    }
    return out;
  }

 private:
  // ---- token helpers -------------------------------------------------------
  const Token& peek(size_t ahead = 0) const {
    size_t i = pos_ + ahead;
    return i < toks_.size() ? toks_[i] : toks_.back();
  }
  const Token& next() {
    const Token& t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }
  bool accept(char c) {
    if (peek().is(c)) {
      next();
      return true;
    }
    return false;
  }

  static std::string describe(const Token& t) {
    if (t.kind == TokenKind::kEnd) return "end of input";
    std::string_view text = t.text.substr(0, 40);
    return fmt::format("'{}'", text);
  }

  Status errorAt(const Token& t, std::string_view what) const {
    return makeError(Code::kInvalidArgument, "{}:{}:{}: {}", source_, t.line, t.column, what);
  }
  Status expected(std::string_view what) const {
    return errorAt(peek(), fmt::format("expected {}, found {}", what, describe(peek())));
  }
  Status expect(char c, std::string_view context) {
    if (accept(c)) return Status::ok();
    return expected(fmt::format("'{}' {}", c, context));
  }

  Result<std::string> identifier(std::string_view what) {
    if (peek().kind != TokenKind::kIdent) return expected(what);
    return std::string(next().text);
  }

  // Parses an integer token (optionally preceded by '-') as a 64-bit pattern.
  Result<int64_t> integer(std::string_view what) {
    bool negative = accept('-');
    if (peek().kind != TokenKind::kInt) return expected(what);
    const Token& t = next();
    std::string_view s = t.text;
    if (!s.empty() && (s.back() == 'U' || s.back() == 'u')) s.remove_suffix(1);
    int base = 10;
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
      base = 16;
      s.remove_prefix(2);
    } else if (s.size() > 2 && s[0] == '0' && (s[1] == 'b' || s[1] == 'B')) {
      base = 2;
      s.remove_prefix(2);
    } else if (s.size() > 1 && s[0] == '0') {
      base = 8;
      s.remove_prefix(1);
    }
    uint64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
    if (ec != std::errc() || p != s.data() + s.size()) {
      return errorAt(t, fmt::format("integer literal {} is malformed or out of range", t.text));
    }
    if (negative) v = ~v + 1;
    return static_cast<int64_t>(v);
  }

  Result<uint32_t> smallInt(std::string_view what) {
    const Token& t = peek();
    ASSIGN_OR_RETURN(int64_t v, integer(what));
    if (v < 0 || v > 0xFFFFFFFFll) return errorAt(t, fmt::format("{} out of range", what));
    return static_cast<uint32_t>(v);
  }

  static std::string unquote(std::string_view quoted) {
    std::string out;
    for (size_t i = 1; i + 1 < quoted.size(); ++i) {
      if (quoted[i] == '\\' && i + 2 < quoted.size()) ++i;
      out.push_back(quoted[i]);
    }
    return out;
  }

  // Skips to and past the next ';' keeping the text (for RawDirective).
  Result<std::string> rawUntilSemicolon() {
    std::string text;
    while (!peek().is(';')) {
      if (peek().kind == TokenKind::kEnd) return expected("';'");
      const Token& t = next();
      if (!text.empty() && t.spaceBefore) text.push_back(' ');
      text.append(t.text);
    }
    next();
    text.push_back(';');
    return text;
  }

  // ---- module level ----------------------------------------------------------
  Status moduleItem(Module& mod) {
    const Token& t = peek();
    if (t.kind != TokenKind::kDot) return expected("a directive");
    if (t.text == ".version") {
      next();
      if (peek().kind != TokenKind::kFloat && peek().kind != TokenKind::kInt) {
        return expected("a version number");
      }
      const Token& v = next();
      size_t dot = v.text.find('.');
      std::string_view major = v.text.substr(0, dot);
      std::string_view minor = dot == std::string_view::npos ? "0" : v.text.substr(dot + 1);
      auto r1 = std::from_chars(major.data(), major.data() + major.size(), mod.versionMajor);
      auto r2 = std::from_chars(minor.data(), minor.data() + minor.size(), mod.versionMinor);
      if (r1.ec != std::errc() || r2.ec != std::errc() ||
          r1.ptr != major.data() + major.size() || r2.ptr != minor.data() + minor.size()) {
        return errorAt(v, fmt::format("malformed version {}", v.text));
      }
      return Status::ok();
    }
    if (t.text == ".target") {
      next();
      do {
        ASSIGN_OR_RETURN(std::string target, identifier("a target name"));
        mod.target.push_back(std::move(target));
      } while (accept(','));
      return Status::ok();
    }
    if (t.text == ".address_size") {
      next();
      ASSIGN_OR_RETURN(mod.addressSize, smallInt("an address size"));
      if (mod.addressSize != 32 && mod.addressSize != 64) {
        return errorAt(t, "address size must be 32 or 64");
      }
      return Status::ok();
    }
    if (t.text == ".file") {
      next();
      FileDirective f;
      ASSIGN_OR_RETURN(f.index, smallInt("a file index"));
      if (peek().kind != TokenKind::kString) return expected("a file name string");
      f.path = unquote(next().text);
      if (accept(',')) {
        ASSIGN_OR_RETURN(int64_t ts, integer("a timestamp"));
        f.timestamp = static_cast<uint64_t>(ts);
        RETURN_IF_ERROR(expect(',', "between timestamp and size"));
        ASSIGN_OR_RETURN(int64_t sz, integer("a file size"));
        f.size = static_cast<uint64_t>(sz);
      }
      mod.items.emplace_back(std::move(f));
      return Status::ok();
    }
    if (t.text == ".section") {
      next();
      ASSIGN_OR_RETURN(SectionDirective s, section());
      mod.items.emplace_back(std::move(s));
      return Status::ok();
    }
    if (t.text == ".pragma") {
      ASSIGN_OR_RETURN(PragmaDirective p, pragma());
      mod.items.emplace_back(std::move(p));
      return Status::ok();
    }
    // Linkage may precede .entry/.func or a variable.
    size_t ahead = 0;
    while (peek(ahead).kind == TokenKind::kDot && linkageFromDot(peek(ahead).text)) ++ahead;
    const Token& what = peek(ahead);
    if (what.isDot(".entry") || what.isDot(".func")) {
      ASSIGN_OR_RETURN(Function f, function());
      mod.items.emplace_back(std::move(f));
      return Status::ok();
    }
    if (what.kind == TokenKind::kDot && spaceFromDot(what.text)) {
      std::vector<VarDecl> decls;
      RETURN_IF_ERROR(declaration(decls));
      for (VarDecl& d : decls) mod.items.emplace_back(std::move(d));
      return Status::ok();
    }
    if (t.isDot(".alias") || t.isDot(".extern") || t.isDot(".weak")) {
      ASSIGN_OR_RETURN(std::string raw, rawUntilSemicolon());
      mod.items.emplace_back(RawDirective{std::move(raw)});
      return Status::ok();
    }
    return errorAt(t, fmt::format("unknown directive {}", describe(t)));
  }

  Result<SectionDirective> section() {
    SectionDirective s;
    if (peek().kind != TokenKind::kDot && peek().kind != TokenKind::kIdent) {
      return expected("a section name");
    }
    s.name = std::string(next().text);
    RETURN_IF_ERROR(expect('{', "to open the section"));
    while (!accept('}')) {
      if (peek().kind == TokenKind::kIdent && peek(1).is(':')) {
        SectionItem item;
        item.label = std::string(next().text);
        next();
        s.items.push_back(std::move(item));
        continue;
      }
      std::optional<Type> type;
      if (peek().kind == TokenKind::kDot) type = typeFromDot(peek().text);
      if (!type) return expected("a label, a data directive (.b8 .b16 .b32 .b64) or '}'");
      next();
      SectionItem item;
      item.type = *type;
      do {
        if (peek().kind == TokenKind::kInt || peek().is('-')) {
          ASSIGN_OR_RETURN(int64_t v, integer("a value"));
          item.values.push_back(Operand::imm(v));
        } else if (peek().kind == TokenKind::kIdent || peek().kind == TokenKind::kDot) {
          // Symbols, including section names such as .debug_abbrev.
          Operand sym = Operand::symbol(std::string(next().text));
          // ptxas takes only "sym+N" in section data ("sym-N" and "sym+-N" are
          // syntax errors), so the AST never holds a negative offset here.
          if (accept('+')) {
            if (peek().is('-')) return expected("a non-negative offset in section data");
            ASSIGN_OR_RETURN(sym.value, integer("an offset"));
          } else if (peek().is('-')) {
            return expected("',' or '+offset' (section data has no negative offsets)");
          }
          item.values.push_back(std::move(sym));
        } else {
          return expected("a data value");
        }
      } while (accept(','));
      s.items.push_back(std::move(item));
    }
    return s;
  }

  Result<PragmaDirective> pragma() {
    next();  // .pragma
    PragmaDirective p;
    do {
      if (peek().kind != TokenKind::kString) return expected("a pragma string");
      p.values.push_back(unquote(next().text));
    } while (accept(','));
    RETURN_IF_ERROR(expect(';', "after .pragma"));
    return p;
  }

  Result<Function> function() {
    Function f;
    f.line = peek().line;
    while (auto l = linkageFromDot(peek().text)) {
      next();
      f.linkage = *l;
    }
    f.isEntry = next().isDot(".entry");
    if (peek().is('(')) {
      if (f.isEntry) return expected("a kernel name (.entry has no return parameters)");
      RETURN_IF_ERROR(paramList(f.returnParams));
    }
    ASSIGN_OR_RETURN(f.name, identifier("a function name"));
    if (peek().is('(')) RETURN_IF_ERROR(paramList(f.params));
    while (peek().kind == TokenKind::kDot) {
      auto kind = attributeFromDot(peek().text);
      if (!kind) break;
      next();
      FunctionAttribute a;
      a.kind = *kind;
      if (peek().kind == TokenKind::kInt) {
        do {
          ASSIGN_OR_RETURN(uint32_t v, smallInt("an attribute value"));
          a.values.push_back(v);
        } while (accept(','));
      }
      f.attributes.push_back(std::move(a));
    }
    if (accept(';')) {
      f.hasBody = false;
      return f;
    }
    if (!peek().is('{')) return expected("'{' or ';' after the function header");
    next();
    while (!accept('}')) {
      if (peek().kind == TokenKind::kEnd) return expected("'}' to close the function body");
      RETURN_IF_ERROR(statement(f.body, 1));
    }
    return f;
  }

  Status paramList(std::vector<VarDecl>& out) {
    next();  // (
    if (accept(')')) return Status::ok();
    do {
      std::vector<VarDecl> decls;
      RETURN_IF_ERROR(declarationNoSemicolon(decls, /*single=*/true));
      for (VarDecl& d : decls) out.push_back(std::move(d));
    } while (accept(','));
    return expect(')', "to close the parameter list");
  }

  // ---- declarations ----------------------------------------------------------
  Status declaration(std::vector<VarDecl>& out) {
    RETURN_IF_ERROR(declarationNoSemicolon(out, /*single=*/false));
    return expect(';', "after the declaration");
  }

  Status declarationNoSemicolon(std::vector<VarDecl>& out, bool single) {
    VarDecl proto;
    proto.line = peek().line;
    bool sawSpace = false;
    while (peek().kind == TokenKind::kDot) {
      std::string_view d = peek().text;
      if (auto l = linkageFromDot(d)) {
        proto.linkage = *l;
      } else if (d == ".ptr") {
        proto.isPtr = true;
      } else if (d == ".attribute") {
        // ".attribute(.managed)": the only attribute a variable takes.
        next();
        RETURN_IF_ERROR(expect('(', "after .attribute"));
        if (peek().kind != TokenKind::kDot || peek().text != ".managed") {
          return expected("a variable attribute (.managed)");
        }
        next();
        RETURN_IF_ERROR(expect(')', "after the attribute"));
        proto.managed = true;
        continue;
      } else if (d == ".align") {
        next();
        ASSIGN_OR_RETURN(uint32_t a, smallInt("an alignment"));
        if (a == 0 || (a & (a - 1)) != 0) {
          return errorAt(toks_[pos_ - 1], "alignment must be a power of two");
        }
        (proto.isPtr ? proto.ptrAlign : proto.align) = a;
        continue;
      } else if (auto s = spaceFromDot(d)) {
        if (proto.isPtr) {
          proto.ptrSpace = *s;
        } else {
          if (sawSpace) return expected("a single state space");
          proto.space = *s;
          sawSpace = true;
        }
      } else if (auto t = typeFromDot(d)) {
        proto.type = *t;
      } else if (d == ".v2" || d == ".v4" || d == ".v8") {
        proto.vectorWidth = static_cast<uint8_t>(d[2] - '0');
      } else {
        break;
      }
      next();
    }
    if (!sawSpace) return expected("a state space (.reg, .param, .global, ...)");
    if (proto.type == Type::kNone) return expected("a type (.b32, .u64, .f32, ...)");
    if (proto.managed && proto.space != StateSpace::kGlobal) {
      return errorAt(toks_[pos_ - 1], ".attribute(.managed) applies to .global variables only");
    }
    do {
      VarDecl d = proto;
      ASSIGN_OR_RETURN(d.name, identifier("a variable name"));
      if (accept('<')) {
        ASSIGN_OR_RETURN(d.rangeCount, smallInt("a register count"));
        if (d.rangeCount == 0) return errorAt(toks_[pos_ - 1], "register count must be > 0");
        RETURN_IF_ERROR(expect('>', "to close the register range"));
      }
      while (accept('[')) {
        if (d.dims.size() >= 8) return errorAt(peek(), "too many array dimensions");
        if (accept(']')) {
          d.dims.push_back(0);
          continue;
        }
        ASSIGN_OR_RETURN(int64_t n, integer("an array size"));
        if (n <= 0) return errorAt(toks_[pos_ - 1], "array size must be positive");
        d.dims.push_back(static_cast<uint64_t>(n));
        RETURN_IF_ERROR(expect(']', "to close the array size"));
      }
      if (accept('=')) {
        ASSIGN_OR_RETURN(Operand init, operand(0));
        d.init = std::move(init);
      }
      out.push_back(std::move(d));
    } while (!single && accept(','));
    return Status::ok();
  }

  // ---- statements ------------------------------------------------------------
  Status statement(std::vector<Statement>& out, size_t depth) {
    const Token& t = peek();
    if (t.is('{')) {
      if (depth >= limits_.maxBlockDepth) {
        return errorAt(t, fmt::format("blocks nested deeper than {}", limits_.maxBlockDepth));
      }
      next();
      Block b;
      while (!accept('}')) {
        if (peek().kind == TokenKind::kEnd) return expected("'}' to close the block");
        RETURN_IF_ERROR(statement(b.statements, depth + 1));
      }
      out.push_back(Statement{std::move(b)});
      return Status::ok();
    }
    if (t.kind == TokenKind::kDot) {
      if (t.text == ".loc") {
        ASSIGN_OR_RETURN(LocDirective loc, locDirective());
        out.push_back(Statement{std::move(loc)});
        return Status::ok();
      }
      if (t.text == ".pragma") {
        ASSIGN_OR_RETURN(PragmaDirective p, pragma());
        out.push_back(Statement{std::move(p)});
        return Status::ok();
      }
      if (spaceFromDot(t.text) || linkageFromDot(t.text) || t.text == ".align") {
        std::vector<VarDecl> decls;
        RETURN_IF_ERROR(declaration(decls));
        for (VarDecl& d : decls) out.push_back(Statement{std::move(d)});
        return Status::ok();
      }
      if (t.text == ".branchtargets" || t.text == ".calltargets") {
        return errorAt(t, "expected a label before " + std::string(t.text));
      }
      return errorAt(t, fmt::format("unknown directive {} in a function body", describe(t)));
    }
    if (t.kind == TokenKind::kIdent && peek(1).is(':')) {
      if (peek(2).isDot(".callprototype") || peek(2).isDot(".branchtargets") ||
          peek(2).isDot(".calltargets")) {
        ASSIGN_OR_RETURN(std::string raw, rawUntilSemicolon());
        out.push_back(Statement{RawDirective{std::move(raw)}});
        return Status::ok();
      }
      Label l{std::string(next().text)};
      next();
      out.push_back(Statement{std::move(l)});
      return Status::ok();
    }
    if (t.is('@') || t.kind == TokenKind::kIdent) {
      ASSIGN_OR_RETURN(Instruction inst, instruction());
      out.push_back(Statement{std::move(inst)});
      return Status::ok();
    }
    return expected("an instruction, label, declaration or directive");
  }

  Result<LocDirective> locDirective() {
    next();  // .loc
    LocDirective loc;
    ASSIGN_OR_RETURN(loc.file, smallInt("a file index"));
    ASSIGN_OR_RETURN(loc.line, smallInt("a line number"));
    ASSIGN_OR_RETURN(loc.column, smallInt("a column number"));
    while (accept(',')) {
      if (peek().kind == TokenKind::kIdent && peek().text == "function_name") {
        next();
        ASSIGN_OR_RETURN(std::string sym, identifier("a function name symbol"));
        Operand fn = Operand::symbol(std::move(sym));
        if (accept('+')) {
          ASSIGN_OR_RETURN(fn.value, integer("an offset"));
        }
        loc.functionName = std::move(fn);
      } else if (peek().kind == TokenKind::kIdent && peek().text == "inlined_at") {
        next();
        LocDirective::InlinedAt at;
        ASSIGN_OR_RETURN(at.file, smallInt("a file index"));
        ASSIGN_OR_RETURN(at.line, smallInt("a line number"));
        ASSIGN_OR_RETURN(at.column, smallInt("a column number"));
        loc.inlinedAt = at;
      } else {
        return expected("function_name or inlined_at");
      }
    }
    return loc;
  }

  Result<Instruction> instruction() {
    Instruction inst;
    inst.line = peek().line;
    if (accept('@')) {
      inst.guard.negated = accept('!');
      ASSIGN_OR_RETURN(inst.guard.reg, identifier("a predicate register after '@'"));
    }
    if (peek().kind != TokenKind::kIdent) return expected("an opcode");
    const Token& opTok = next();
    inst.opcode = modifierTable().opcode(opTok.text);
    if (inst.opcode == Opcode::kNone) {
      return errorAt(opTok, fmt::format("unknown opcode '{}'", opTok.text.substr(0, 40)));
    }
    while (peek().kind == TokenKind::kDot && !peek().spaceBefore) {
      const Token& m = next();
      auto mod = modifierTable().find(m.text.substr(1));
      if (!mod) {
        return errorAt(m, fmt::format("unknown modifier '{}' on {}", m.text.substr(0, 40),
                                      opTok.text));
      }
      inst.mods.push_back(resolveMod(inst.opcode, *mod));
    }
    if (!peek().is(';')) {
      do {
        ASSIGN_OR_RETURN(Operand o, operand(0));
        inst.operands.push_back(std::move(o));
      } while (accept(','));
    }
    RETURN_IF_ERROR(expect(';', fmt::format("after the operands of {}", opTok.text)));
    inst.m = decodeModifiers(inst.opcode, inst.mods);
    return inst;
  }

  // ---- operands ----------------------------------------------------------------
  Result<Operand> floatLiteral(bool negative) {
    const Token& t = next();
    std::string_view s = t.text;
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'f' || s[1] == 'F' || s[1] == 'd' || s[1] == 'D')) {
      uint64_t bits = 0;
      std::from_chars(s.data() + 2, s.data() + s.size(), bits, 16);
      bool is32 = s[1] == 'f' || s[1] == 'F';
      if (negative) bits ^= is32 ? 0x80000000ull : 0x8000000000000000ull;
      return is32 ? Operand::f32(static_cast<uint32_t>(bits)) : Operand::f64(bits);
    }
    std::string copy(s);
    char* end = nullptr;
    double d = std::strtod(copy.c_str(), &end);
    if (end != copy.c_str() + copy.size()) {
      return errorAt(t, fmt::format("malformed float literal {}", s));
    }
    if (negative) d = -d;
    uint64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    return Operand::f64(bits);
  }

  Result<Operand> address() {
    next();  // [
    Operand a;
    a.kind = OperandKind::kAddress;
    if (peek().kind == TokenKind::kIdent) {
      const Token& b = next();
      a.name = std::string(b.text);
      a.addressIsSymbol = b.text[0] != '%';
      if (peek().is('+') || peek().is('-')) {
        bool minus = next().is('-');
        ASSIGN_OR_RETURN(int64_t off, integer("an address offset"));
        a.value = minus ? static_cast<int64_t>(0 - static_cast<uint64_t>(off)) : off;
      }
    } else if (peek().kind == TokenKind::kInt) {
      ASSIGN_OR_RETURN(a.value, integer("an address"));
    } else {
      return expected("a register, symbol or immediate address");
    }
    // Texture and surface instructions: [tex, {coordinates}], [tex, sampler,
    // {coordinates}], [surf, {coordinates}].
    while (accept(',')) {
      ASSIGN_OR_RETURN(Operand e, operand(1));
      a.elements.push_back(std::move(e));
    }
    RETURN_IF_ERROR(expect(']', "to close the address"));
    return a;
  }

  Result<Operand> operand(size_t depth) {
    if (depth >= limits_.maxOperandDepth) {
      return errorAt(peek(), fmt::format("operands nested deeper than {}",
                                         limits_.maxOperandDepth));
    }
    const Token& t = peek();
    if (t.is('[')) return address();
    if (t.is('{') || t.is('(')) {
      char close = t.is('{') ? '}' : ')';
      next();
      Operand o;
      o.kind = close == '}' ? OperandKind::kVector : OperandKind::kList;
      if (!accept(close)) {
        do {
          ASSIGN_OR_RETURN(Operand e, operand(depth + 1));
          o.elements.push_back(std::move(e));
        } while (accept(','));
        RETURN_IF_ERROR(expect(close, close == '}' ? "to close the vector" : "to close the list"));
      }
      return o;
    }
    if (t.is('!')) {
      next();
      if (peek().kind != TokenKind::kIdent) return expected("a predicate after '!'");
      Operand o = Operand::reg(std::string(next().text));
      o.negated = true;
      return o;
    }
    if (t.is('-')) {
      if (peek(1).kind == TokenKind::kFloat) {
        next();
        return floatLiteral(true);
      }
      ASSIGN_OR_RETURN(int64_t v, integer("a number"));
      return Operand::imm(v);
    }
    if (t.kind == TokenKind::kInt) {
      ASSIGN_OR_RETURN(int64_t v, integer("a number"));
      return Operand::imm(v);
    }
    if (t.kind == TokenKind::kFloat) return floatLiteral(false);
    if (t.kind == TokenKind::kIdent) {
      next();
      if (t.text == "_") return Operand::sink();
      if (t.text == "generic" && peek().is('(')) {
        next();
        ASSIGN_OR_RETURN(std::string sym, identifier("a symbol in generic()"));
        RETURN_IF_ERROR(expect(')', "to close generic("));
        Operand o = Operand::symbol(std::move(sym));
        o.generic = true;
        RETURN_IF_ERROR(symbolOffset(o));
        return o;
      }
      if (t.text[0] == '%') {
        Operand o = Operand::reg(std::string(t.text));
        if (peek().kind == TokenKind::kDot && !peek().spaceBefore && peek().text.size() == 2) {
          char c = peek().text[1];
          if (c == 'x' || c == 'y' || c == 'z' || c == 'w' || c == 'r' || c == 'g' ||
              c == 'b' || c == 'a') {
            o.component = c;
            next();
          }
        }
        if (accept('|')) return predicatePair(std::move(o));
        return o;
      }
      // Registers declared without '%' (`.reg .pred p;` in inline assembly) can
      // be a pair too: `shfl.sync.down.b32 r0|p, ...`.
      if (peek().is('|')) {
        next();
        return predicatePair(Operand::reg(std::string(t.text)));
      }
      Operand o = Operand::symbol(std::string(t.text));
      RETURN_IF_ERROR(symbolOffset(o));
      return o;
    }
    return expected("an operand");
  }

  // `first|second` after the '|': the destination and predicate of setp, shfl and friends.
  Result<Operand> predicatePair(Operand first) {
    if (peek().kind != TokenKind::kIdent) return expected("a predicate after '|'");
    Operand second = Operand::reg(std::string(next().text));
    Operand pair;
    pair.kind = OperandKind::kPredPair;
    pair.elements.push_back(std::move(first));
    pair.elements.push_back(std::move(second));
    return pair;
  }

  Status symbolOffset(Operand& o) {
    if ((peek().is('+') || peek().is('-')) && peek(1).kind != TokenKind::kPunct) {
      bool minus = next().is('-');
      ASSIGN_OR_RETURN(int64_t off, integer("a symbol offset"));
      o.value = minus ? static_cast<int64_t>(0 - static_cast<uint64_t>(off)) : off;
    } else if (peek().is('+') && peek(1).is('-')) {
      next();
      ASSIGN_OR_RETURN(o.value, integer("a symbol offset"));
    }
    return Status::ok();
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  std::string_view source_;
  ParseLimits limits_;
};

}  // namespace
}  // namespace detail

Result<Module> parseModule(std::string_view text, std::string_view sourceName,
                           const ParseLimits& limits) {
  if (text.size() > limits.maxInputBytes) {
    return makeError(Code::kResourceExhausted, "{}: input of {} bytes exceeds the limit of {}",
                     sourceName, text.size(), limits.maxInputBytes);
  }
  ASSIGN_OR_RETURN(auto tokens, detail::tokenize(text, sourceName));
  return detail::Parser(std::move(tokens), sourceName, limits).module();
}

Result<std::vector<Statement>> parseStatements(std::string_view text, std::string_view sourceName,
                                               const ParseLimits& limits) {
  if (text.size() > limits.maxInputBytes) {
    return makeError(Code::kResourceExhausted, "{}: input of {} bytes exceeds the limit of {}",
                     sourceName, text.size(), limits.maxInputBytes);
  }
  ASSIGN_OR_RETURN(auto tokens, detail::tokenize(text, sourceName));
  return detail::Parser(std::move(tokens), sourceName, limits).statements();
}

}  // namespace phos::ptx
