// SPDX-License-Identifier: Apache-2.0
// Kernel signatures outside the PTX: demangled names, declared C++ types, the
// signature database file and the JSON `phos-instrument signatures` prints.
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "internal/declaration.h"
#include "phos/instrument/signature.h"

namespace phos::instrument {

std::string_view name(Access a) {
  switch (a) {
    case Access::kNone: return "none";
    case Access::kRead: return "read";
    case Access::kWrite: return "write";
    case Access::kReadWrite: return "readwrite";
  }
  return "none";
}

std::optional<std::string> demangle(std::string_view mangled) {
  if (mangled.size() < 2 || mangled.substr(0, 2) != "_Z") return std::nullopt;
  std::string z(mangled);
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(z.c_str(), nullptr, nullptr, &status), std::free);
  if (status != 0 || !out) return std::nullopt;
  return std::string(out.get());
}

namespace detail {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// Drops trailing cv/restrict qualifiers that apply to the pointer itself.
std::string_view stripTopQualifiers(std::string_view s) {
  for (bool again = true; again;) {
    again = false;
    s = trim(s);
    for (std::string_view q : {"const", "volatile", "__restrict__", "__restrict", "restrict"}) {
      if (s.size() > q.size() && s.substr(s.size() - q.size()) == q) {
        char before = s[s.size() - q.size() - 1];
        if (before == ' ' || before == '*') {
          s.remove_suffix(q.size());
          again = true;
          break;
        }
      }
    }
  }
  return s;
}

bool hasWord(std::string_view s, std::string_view word) {
  for (size_t p = s.find(word); p != std::string_view::npos; p = s.find(word, p + 1)) {
    bool startOk = p == 0 || s[p - 1] == ' ';
    size_t e = p + word.size();
    bool endOk = e == s.size() || s[e] == ' ' || s[e] == '*' || s[e] == '&';
    if (startOk && endOk) return true;
  }
  return false;
}

}  // namespace

std::optional<bool> pointeeIsConst(std::string_view type) {
  std::string_view t = stripTopQualifiers(type);
  if (t.empty() || t.back() != '*') return std::nullopt;
  t.remove_suffix(1);
  std::string_view pointee = trim(t);
  // The pointee's own top level: "float const" or "const float"; for
  // "float const*" as pointee ("float const**") the last '*' ends its top level.
  size_t star = pointee.rfind('*');
  std::string_view top = star == std::string_view::npos ? pointee : pointee.substr(star + 1);
  if (star != std::string_view::npos) return hasWord(top, "const");
  return hasWord(pointee, "const");
}

Access effectiveAccess(Access observed, bool escapes, bool declaredConst) {
  if (!escapes) return observed;
  // Lost track of the value: anything may happen through it, unless the type
  // says it only reads (a store the PTX showed us stays).
  return declaredConst ? observed | Access::kRead : Access::kReadWrite;
}

std::optional<DeclaredKernel> declarationFromDemangled(std::string_view ptxName,
                                                       std::string_view demangled) {
  // The parameter list is the last top-level parenthesis group.
  std::string_view s = trim(demangled);
  // Trailing cv of member functions never appears on kernels; require ')'.
  if (s.empty() || s.back() != ')') return std::nullopt;
  int depth = 0;
  size_t open = std::string_view::npos;
  for (size_t i = s.size(); i-- > 0;) {
    char c = s[i];
    if (c == ')' || c == '>' || c == ']') ++depth;
    if (c == '(' || c == '<' || c == '[') {
      if (--depth == 0 && c == '(') {
        open = i;
        break;
      }
    }
  }
  if (open == std::string_view::npos) return std::nullopt;
  std::string_view list = s.substr(open + 1, s.size() - open - 2);
  DeclaredKernel k;
  k.name = std::string(ptxName);
  if (trim(list).empty() || trim(list) == "void") return k;
  std::vector<std::string_view> parts;
  depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    char c = i < list.size() ? list[i] : ',';
    if (c == '(' || c == '<' || c == '[') ++depth;
    if (c == ')' || c == '>' || c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(trim(list.substr(start, i - start)));
      start = i + 1;
    }
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    DeclaredParam p;
    p.ordinal = static_cast<uint32_t>(i);
    p.type = std::string(parts[i]);
    if (auto c = pointeeIsConst(parts[i])) {
      p.pointers[0] = p.type;
      p.pointeeConst[0] = *c;
    }
    k.params.push_back(std::move(p));
  }
  return k;
}

Status applyDeclaredTypes(KernelSignature& target, const DeclaredKernel& declared,
                          SignatureSource source) {
  // All or nothing: a declaration that does not fit leaves the signature as it was.
  KernelSignature signature = target;
  if (declared.params.size() != signature.params.size()) {
    return makeError(Code::kInvalidArgument,
                     "kernel {}: declared with {} parameters, the PTX has {}", signature.name,
                     declared.params.size(), signature.params.size());
  }
  for (const DeclaredParam& dp : declared.params) {
    if (dp.ordinal >= signature.params.size()) {
      return makeError(Code::kInvalidArgument, "kernel {}: declared parameter {} does not exist",
                       signature.name, dp.ordinal);
    }
    ParamSignature& ps = signature.params[dp.ordinal];
    for (const auto& [off, type] : dp.pointers) {
      const uint64_t wordOffset = ps.offset + off;  // (clang 14 cannot capture a binding)
      auto w = std::find_if(ps.words.begin(), ps.words.end(),
                            [&](const PointerWord& x) { return x.offset == wordOffset; });
      if (w == ps.words.end()) {
        return makeError(Code::kInvalidArgument,
                         "kernel {}: parameter {} ('{}') has no pointer word at byte {} for "
                         "declared '{}'",
                         signature.name, dp.ordinal, ps.name, off, type);
      }
      w->declaredType = type;
      auto c = dp.pointeeConst.find(off);
      w->declaredConst = c != dp.pointeeConst.end() ? c->second
                                                    : pointeeIsConst(type).value_or(false);
      // For a word that did not escape, `access` is what the PTX saw (also when a
      // signature was built by hand without `observed`).
      Access seen = w->escapes ? w->observed : w->observed | w->access;
      w->access = effectiveAccess(seen, w->escapes, w->declaredConst);
    }
  }
  signature.sources |= source;
  target = std::move(signature);
  return Status::ok();
}

}  // namespace detail

Status applyDeclaration(KernelSignature& signature, const DeclaredKernel& declared) {
  return detail::applyDeclaredTypes(signature, declared, kFromSourceScan);
}

// --- The signature database --------------------------------------------------

namespace {

using nlohmann::json;

Result<uint32_t> unsignedField(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) return makeError(Code::kInvalidArgument, "{}: missing '{}'", where, key);
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
    return makeError(Code::kInvalidArgument, "{}: '{}' must be a non-negative integer", where,
                     key);
  }
  uint64_t v = it->get<uint64_t>();
  if (v > 0xFFFFFFFFull) {
    return makeError(Code::kInvalidArgument, "{}: '{}' is too large ({})", where, key, v);
  }
  return static_cast<uint32_t>(v);
}

Result<std::string> stringField(const json& j, const char* key, const std::string& where,
                                bool required) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (!required) return std::string();
    return makeError(Code::kInvalidArgument, "{}: missing '{}'", where, key);
  }
  if (!it->is_string()) {
    return makeError(Code::kInvalidArgument, "{}: '{}' must be a string", where, key);
  }
  return it->get<std::string>();
}

Result<DeclaredKernel> kernelFromJson(const json& k, const std::string& where) {
  if (!k.is_object()) return makeError(Code::kInvalidArgument, "{}: not an object", where);
  DeclaredKernel out;
  ASSIGN_OR_RETURN(out.name, stringField(k, "name", where, true));
  if (out.name.empty()) return makeError(Code::kInvalidArgument, "{}: empty 'name'", where);
  auto params = k.find("params");
  if (params == k.end()) return out;
  if (!params->is_array()) {
    return makeError(Code::kInvalidArgument, "{} ({}): 'params' must be an array", where,
                     out.name);
  }
  for (size_t i = 0; i < params->size(); ++i) {
    const json& p = (*params)[i];
    std::string pw = fmt::format("{} ({}).params[{}]", where, out.name, i);
    if (!p.is_object()) return makeError(Code::kInvalidArgument, "{}: not an object", pw);
    DeclaredParam dp;
    ASSIGN_OR_RETURN(dp.ordinal, unsignedField(p, "ordinal", pw));
    ASSIGN_OR_RETURN(dp.type, stringField(p, "type", pw, false));
    auto pointers = p.find("pointers");
    if (pointers != p.end()) {
      if (!pointers->is_array()) {
        return makeError(Code::kInvalidArgument, "{}: 'pointers' must be an array", pw);
      }
      for (size_t j = 0; j < pointers->size(); ++j) {
        const json& q = (*pointers)[j];
        std::string qw = fmt::format("{}.pointers[{}]", pw, j);
        if (!q.is_object()) return makeError(Code::kInvalidArgument, "{}: not an object", qw);
        ASSIGN_OR_RETURN(uint32_t off, unsignedField(q, "offset", qw));
        ASSIGN_OR_RETURN(std::string type, stringField(q, "type", qw, false));
        bool isConst = detail::pointeeIsConst(type).value_or(false);
        if (auto c = q.find("const"); c != q.end()) {
          if (!c->is_boolean()) {
            return makeError(Code::kInvalidArgument, "{}: 'const' must be true or false", qw);
          }
          isConst = c->get<bool>();
        }
        dp.pointers[off] = std::move(type);
        dp.pointeeConst[off] = isConst;
      }
    }
    out.params.push_back(std::move(dp));
  }
  std::sort(out.params.begin(), out.params.end(),
            [](const DeclaredParam& a, const DeclaredParam& b) { return a.ordinal < b.ordinal; });
  for (size_t i = 1; i < out.params.size(); ++i) {
    if (out.params[i].ordinal == out.params[i - 1].ordinal) {
      return makeError(Code::kInvalidArgument, "{} ({}): parameter {} declared twice", where,
                       out.name, out.params[i].ordinal);
    }
  }
  return out;
}

// 1-based line of byte `offset` in `text`.
size_t lineOf(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  return 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + offset, '\n'));
}

}  // namespace

Result<SignatureDatabase> SignatureDatabase::parse(std::string_view text) {
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    // nlohmann reports the byte just past the problem; 0 when it has none.
    size_t byte = e.byte > 0 ? e.byte - 1 : 0;
    return makeError(Code::kInvalidArgument, "line {}: not valid JSON: {}", lineOf(text, byte),
                     e.what());
  }
  if (!doc.is_object()) {
    return makeError(Code::kInvalidArgument, "the signature database must be a JSON object");
  }
  auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer() || version->get<int64_t>() != 1) {
    return makeError(Code::kInvalidArgument,
                     "unsupported signature database version {} (this build reads 1)",
                     version == doc.end() ? std::string("(missing)") : version->dump());
  }
  auto kernels = doc.find("kernels");
  if (kernels == doc.end() || !kernels->is_array()) {
    return makeError(Code::kInvalidArgument, "'kernels' must be an array");
  }
  SignatureDatabase db;
  for (size_t i = 0; i < kernels->size(); ++i) {
    ASSIGN_OR_RETURN(DeclaredKernel k,
                     kernelFromJson((*kernels)[i], fmt::format("kernels[{}]", i)));
    db.add(std::move(k));
  }
  return db;
}

Result<SignatureDatabase> SignatureDatabase::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errnoError(errno, "cannot open signature database " + path);
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return errnoError(errno, "cannot read signature database " + path);
  Result<SignatureDatabase> db = parse(buf.str());
  if (!db.isOk()) return std::move(db).status().withContext(path);
  return db;
}

std::string SignatureDatabase::toJson() const {
  json kernels = json::array();
  for (const auto& [name, k] : kernels_) {
    json params = json::array();
    for (const DeclaredParam& p : k.params) {
      json pointers = json::array();
      for (const auto& [off, type] : p.pointers) {
        auto c = p.pointeeConst.find(off);
        pointers.push_back({{"offset", off},
                            {"type", type},
                            {"const", c != p.pointeeConst.end() && c->second}});
      }
      params.push_back({{"ordinal", p.ordinal}, {"type", p.type}, {"pointers", pointers}});
    }
    kernels.push_back({{"name", k.name}, {"params", params}});
  }
  json doc = {{"version", 1}, {"kernels", kernels}};
  return doc.dump(2) + "\n";
}

void SignatureDatabase::add(DeclaredKernel kernel) {
  std::string key = kernel.name;
  kernels_.insert_or_assign(std::move(key), std::move(kernel));
}

const DeclaredKernel* SignatureDatabase::find(std::string_view name) const {
  auto it = kernels_.find(name);
  return it == kernels_.end() ? nullptr : &it->second;
}

nlohmann::json toJson(const KernelSignature& s) {
  using nlohmann::json;
  json params = json::array();
  for (const ParamSignature& p : s.params) {
    json words = json::array();
    for (const PointerWord& w : p.words) {
      words.push_back({{"offset", w.offset},
                       {"access", std::string(name(w.access))},
                       {"observed", std::string(name(w.observed))},
                       {"escapes", w.escapes},
                       {"declared_const", w.declaredConst},
                       {"declared_type", w.declaredType}});
    }
    params.push_back({{"ordinal", p.ordinal},
                      {"name", p.name},
                      {"offset", p.offset},
                      {"size", p.size},
                      {"words", words}});
  }
  json globals = json::array();
  for (const GlobalUse& g : s.globals) {
    globals.push_back({{"name", g.name}, {"access", std::string(name(g.access))}});
  }
  json sources = json::array();
  if (s.sources & kFromPtx) sources.push_back("ptx");
  if (s.sources & kFromMangledName) sources.push_back("mangled_name");
  if (s.sources & kFromSourceScan) sources.push_back("source_scan");
  return {{"name", s.name},
          {"demangled", s.demangled},
          {"param_bytes", s.paramBytes},
          {"params", params},
          {"globals", globals},
          {"indirect", std::string(name(s.indirect))},
          {"sources", sources}};
}

}  // namespace phos::instrument
