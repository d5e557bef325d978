// SPDX-License-Identifier: Apache-2.0
// PTX printer: writes the AST in the layout nvcc uses, so diffs against nvcc output stay small.
#include "phos/ptx/printer.h"

#include <fmt/format.h>

namespace phos::ptx {
namespace {

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

// "+8", "+-256": the form nvcc emits for negative offsets, accepted by ptxas.
void appendOffset(std::string& out, int64_t off) {
  if (off != 0) fmt::format_to(std::back_inserter(out), "+{}", off);
}

class Printer {
 public:
  std::string& out() { return out_; }

  void operand(const Operand& o) {
    switch (o.kind) {
      case OperandKind::kNone:
        break;
      case OperandKind::kRegister:
        if (o.negated) out_.push_back('!');
        out_ += o.name;
        if (o.component) {
          out_.push_back('.');
          out_.push_back(o.component);
        }
        break;
      case OperandKind::kImmInt:
        fmt::format_to(std::back_inserter(out_), "{}", o.value);
        break;
      case OperandKind::kImmFloat:
        if (o.floatWidth == 32) {
          fmt::format_to(std::back_inserter(out_), "0f{:08X}",
                         static_cast<uint32_t>(o.floatBits));
        } else {
          fmt::format_to(std::back_inserter(out_), "0d{:016X}", o.floatBits);
        }
        break;
      case OperandKind::kSymbol:
        if (o.generic) {
          out_ += "generic(";
          out_ += o.name;
          out_ += ")";
        } else {
          out_ += o.name;
        }
        appendOffset(out_, o.value);
        break;
      case OperandKind::kAddress:
        out_.push_back('[');
        if (o.name.empty()) {
          fmt::format_to(std::back_inserter(out_), "{}", o.value);
        } else {
          out_ += o.name;
          appendOffset(out_, o.value);
        }
        for (const Operand& e : o.elements) {
          out_ += ", ";
          operand(e);
        }
        out_.push_back(']');
        break;
      case OperandKind::kVector:
      case OperandKind::kList:
        out_.push_back(o.kind == OperandKind::kVector ? '{' : '(');
        for (size_t i = 0; i < o.elements.size(); ++i) {
          if (i) out_ += ", ";
          operand(o.elements[i]);
        }
        out_.push_back(o.kind == OperandKind::kVector ? '}' : ')');
        break;
      case OperandKind::kPredPair:
        for (size_t i = 0; i < o.elements.size(); ++i) {
          if (i) out_.push_back('|');
          operand(o.elements[i]);
        }
        break;
      case OperandKind::kSink:
        out_.push_back('_');
        break;
    }
  }

  void instruction(const Instruction& inst) {
    if (inst.guard.present()) {
      out_ += inst.guard.negated ? "@!" : "@";
      out_ += inst.guard.reg;
      out_.push_back(' ');
    }
    out_ += name(inst.opcode);
    for (const Mod& m : inst.mods) {
      out_.push_back('.');
      out_ += modName(m);
    }
    for (size_t i = 0; i < inst.operands.size(); ++i) {
      out_ += i ? ", " : " \t";
      operand(inst.operands[i]);
    }
    out_.push_back(';');
  }

  void decl(const VarDecl& d) {
    bool first = true;
    auto word = [&](std::string_view w) {
      if (!first) out_.push_back(' ');
      first = false;
      out_.push_back('.');
      out_ += w;
    };
    if (d.linkage != Linkage::kNone) word(name(d.linkage));
    word(name(d.space));
    if (d.managed) word("attribute(.managed)");
    if (d.align) word(fmt::format("align {}", d.align));
    if (d.vectorWidth > 1) word(fmt::format("v{}", d.vectorWidth));
    word(name(d.type));
    if (d.isPtr) {
      word("ptr");
      if (d.ptrSpace != StateSpace::kNone) word(name(d.ptrSpace));
      if (d.ptrAlign) word(fmt::format("align {}", d.ptrAlign));
    }
    out_ += " \t";
    out_ += d.name;
    if (d.rangeCount) fmt::format_to(std::back_inserter(out_), "<{}>", d.rangeCount);
    for (uint64_t dim : d.dims) {
      if (dim) {
        fmt::format_to(std::back_inserter(out_), "[{}]", dim);
      } else {
        out_ += "[]";
      }
    }
    if (d.init) {
      out_ += " = ";
      operand(*d.init);
    }
  }

  void loc(const LocDirective& l) {
    fmt::format_to(std::back_inserter(out_), ".loc\t{} {} {}", l.file, l.line, l.column);
    if (l.functionName) {
      out_ += ", function_name ";
      operand(*l.functionName);
    }
    if (l.inlinedAt) {
      fmt::format_to(std::back_inserter(out_), ", inlined_at {} {} {}", l.inlinedAt->file,
                     l.inlinedAt->line, l.inlinedAt->column);
    }
  }

  void pragma(const PragmaDirective& p) {
    out_ += ".pragma ";
    for (size_t i = 0; i < p.values.size(); ++i) {
      if (i) out_ += ", ";
      out_ += quote(p.values[i]);
    }
    out_.push_back(';');
  }

  void indent(int depth) { out_.append(static_cast<size_t>(depth), '\t'); }

  void statements(const std::vector<Statement>& body, int depth) {
    for (const Statement& s : body) statement(s, depth);
  }

  void statement(const Statement& s, int depth) {
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, Instruction>) {
            indent(depth);
            instruction(v);
          } else if constexpr (std::is_same_v<T, Label>) {
            out_ += v.name;
            out_.push_back(':');
          } else if constexpr (std::is_same_v<T, Block>) {
            indent(depth);
            out_ += "{\n";
            statements(v.statements, depth + 1);
            indent(depth);
            out_.push_back('}');
          } else if constexpr (std::is_same_v<T, VarDecl>) {
            indent(depth);
            decl(v);
            out_.push_back(';');
          } else if constexpr (std::is_same_v<T, LocDirective>) {
            indent(depth);
            loc(v);
          } else if constexpr (std::is_same_v<T, PragmaDirective>) {
            indent(depth);
            pragma(v);
          } else if constexpr (std::is_same_v<T, RawDirective>) {
            indent(depth);
            out_ += v.text;
          }
        },
        s.value);
    out_.push_back('\n');
  }

  void paramList(const std::vector<VarDecl>& params, bool multiline) {
    out_.push_back('(');
    for (size_t i = 0; i < params.size(); ++i) {
      if (i) out_.push_back(',');
      if (multiline) out_ += "\n\t";
      decl(params[i]);
    }
    if (multiline && !params.empty()) out_.push_back('\n');
    out_.push_back(')');
  }

  void function(const Function& f) {
    if (f.linkage != Linkage::kNone) {
      out_.push_back('.');
      out_ += name(f.linkage);
      out_.push_back(' ');
    }
    out_ += f.isEntry ? ".entry " : ".func ";
    if (!f.isEntry && !f.returnParams.empty()) {
      paramList(f.returnParams, false);
      out_.push_back(' ');
    }
    out_ += f.name;
    paramList(f.params, true);
    out_.push_back('\n');
    for (const FunctionAttribute& a : f.attributes) {
      out_.push_back('.');
      out_ += name(a.kind);
      for (size_t i = 0; i < a.values.size(); ++i) {
        out_ += i ? ", " : " ";
        fmt::format_to(std::back_inserter(out_), "{}", a.values[i]);
      }
      out_.push_back('\n');
    }
    if (!f.hasBody) {
      out_ += ";\n";
      return;
    }
    out_ += "{\n";
    statements(f.body, 1);
    out_ += "}\n";
  }

  void section(const SectionDirective& s) {
    out_ += ".section\t";
    out_ += s.name;
    out_ += "\n{\n";
    for (const SectionItem& item : s.items) {
      if (item.label) {
        out_ += *item.label;
        out_ += ":\n";
        continue;
      }
      out_.push_back('.');
      out_ += name(item.type);
      out_.push_back(' ');
      for (size_t i = 0; i < item.values.size(); ++i) {
        if (i) out_.push_back(',');
        operand(item.values[i]);
      }
      out_.push_back('\n');
    }
    out_ += "}\n";
  }

  void module(const Module& m) {
    fmt::format_to(std::back_inserter(out_), ".version {}.{}\n", m.versionMajor, m.versionMinor);
    if (!m.target.empty()) {
      out_ += ".target ";
      for (size_t i = 0; i < m.target.size(); ++i) {
        if (i) out_ += ", ";
        out_ += m.target[i];
      }
      out_.push_back('\n');
    }
    fmt::format_to(std::back_inserter(out_), ".address_size {}\n", m.addressSize);
    for (const ModuleItem& item : m.items) {
      out_.push_back('\n');
      std::visit(
          [&](const auto& v) {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, Function>) {
              function(v);
            } else if constexpr (std::is_same_v<T, VarDecl>) {
              decl(v);
              out_ += ";\n";
            } else if constexpr (std::is_same_v<T, FileDirective>) {
              fmt::format_to(std::back_inserter(out_), ".file\t{} {}", v.index, quote(v.path));
              if (v.timestamp) {
                fmt::format_to(std::back_inserter(out_), ", {}, {}", *v.timestamp,
                               v.size.value_or(0));
              }
              out_.push_back('\n');
            } else if constexpr (std::is_same_v<T, SectionDirective>) {
              section(v);
            } else if constexpr (std::is_same_v<T, PragmaDirective>) {
              pragma(v);
              out_.push_back('\n');
            } else if constexpr (std::is_same_v<T, RawDirective>) {
              out_ += v.text;
              out_.push_back('\n');
            }
          },
          item);
    }
  }

 private:
  std::string out_;
};

}  // namespace

std::string print(const Module& module) {
  Printer p;
  p.module(module);
  return std::move(p.out());
}

std::string print(const Function& function) {
  Printer p;
  p.function(function);
  return std::move(p.out());
}

std::string print(const Instruction& instruction) {
  Printer p;
  p.instruction(instruction);
  return std::move(p.out());
}

std::string print(const Operand& operand) {
  Printer p;
  p.operand(operand);
  return std::move(p.out());
}

std::string print(const VarDecl& decl) {
  Printer p;
  p.decl(decl);
  return std::move(p.out());
}

}  // namespace phos::ptx
