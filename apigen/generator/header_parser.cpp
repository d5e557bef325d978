// SPDX-License-Identifier: Apache-2.0
// Reads cuda.h, cudaProfiler.h and their PFN typedef headers with libclang into the generator's ApiModel.
#include "header_parser.h"

#include <clang-c/Index.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string_view>
#include <system_error>

#include "version_map.h"

namespace phos::apigen {
namespace {

std::string toString(CXString s) {
  const char* c = clang_getCString(s);
  std::string out = c != nullptr ? c : "";
  clang_disposeString(s);
  return out;
}

struct IndexDeleter {
  void operator()(void* index) const { clang_disposeIndex(index); }
};
struct TuDeleter {
  void operator()(CXTranslationUnit tu) const { clang_disposeTranslationUnit(tu); }
};
using IndexPtr = std::unique_ptr<void, IndexDeleter>;
using TuPtr = std::unique_ptr<CXTranslationUnitImpl, TuDeleter>;

// What one preprocessor configuration of the headers declares.
struct ParsePass {
  std::map<std::string, EntryPoint> functions;
  std::map<std::string, PfnTypedef> typedefs;
  std::map<std::string, Rename> renames;
  int cudaVersion = 0;
};

std::string canonicalSpelling(CXType type) { return toString(clang_getTypeSpelling(clang_getCanonicalType(type))); }

std::string signatureOf(CXType result, const std::vector<std::string>& canonicalArgs) {
  std::string sig = canonicalSpelling(result) + " (";
  for (size_t i = 0; i < canonicalArgs.size(); ++i) {
    if (i != 0) sig += ", ";
    sig += canonicalArgs[i];
  }
  return sig + ")";
}

bool isStreamType(CXType type) {
  // CUstream is `struct CUstream_st *`; compare canonically so CUstream_v1-style
  // aliases count too.
  return canonicalSpelling(type) == "struct CUstream_st *";
}

// Keeps only what the named header itself declares (not stdlib.h, not cuda.h
// when reading cudaTypedefs.h).
bool isInFile(CXCursor cursor, CXFile file) {
  CXFile where = nullptr;
  clang_getSpellingLocation(clang_getCursorLocation(cursor), &where, nullptr, nullptr, nullptr);
  return where != nullptr && clang_File_isEqual(where, file) != 0;
}

std::vector<std::string> tokensOf(CXTranslationUnit tu, CXCursor cursor) {
  CXToken* tokens = nullptr;
  unsigned count = 0;
  clang_tokenize(tu, clang_getCursorExtent(cursor), &tokens, &count);
  std::vector<std::string> out;
  out.reserve(count);
  for (unsigned i = 0; i < count; ++i) out.push_back(toString(clang_getTokenSpelling(tu, tokens[i])));
  clang_disposeTokens(tu, tokens, count);
  return out;
}

// "PFN_cuMemcpyHtoD_v7000_ptds" -> {cuMemcpyHtoD, 7000, per-thread}.
bool splitTypedefName(const std::string& name, PfnTypedef& out) {
  std::string_view rest(name);
  if (!rest.starts_with("PFN_")) return false;
  rest.remove_prefix(4);
  out.perThread = false;
  if (rest.ends_with("_ptds") || rest.ends_with("_ptsz")) {
    out.perThread = true;
    rest.remove_suffix(5);
  }
  size_t v = rest.rfind("_v");
  if (v == std::string_view::npos || v + 2 >= rest.size()) return false;
  std::string_view digits = rest.substr(v + 2);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  out.typedefName = name;
  out.publicName = std::string(rest.substr(0, v));
  out.version = std::stoi(std::string(digits));
  return true;
}

ParamKind kindOf(CXType canonical) {
  if (canonical.kind != CXType_Pointer) return ParamKind::kValue;
  CXType pointee = clang_getCanonicalType(clang_getPointeeType(canonical));
  switch (pointee.kind) {
    case CXType_FunctionProto:
    case CXType_FunctionNoProto:
      return ParamKind::kCallback;
    case CXType_Void:
      return clang_isConstQualifiedType(pointee) != 0 ? ParamKind::kPointer : ParamKind::kAddress;
    case CXType_Record:
      // `typedef struct CUstream_st *CUstream;` never defines CUstream_st.
      return clang_Type_getSizeOf(pointee) == CXTypeLayoutError_Incomplete ? ParamKind::kHandle : ParamKind::kPointer;
    default:
      return ParamKind::kPointer;
  }
}

EntryPoint entryPointOf(CXCursor fn) {
  EntryPoint e;
  e.symbol = toString(clang_getCursorSpelling(fn));
  e.publicName = publicNameOf(e.symbol);
  e.returnType = toString(clang_getTypeSpelling(clang_getCursorResultType(fn)));
  e.returnCanonical = canonicalSpelling(clang_getCursorResultType(fn));
  e.deprecated = clang_getCursorAvailability(fn) == CXAvailability_Deprecated;
  e.origin = isPerThreadSymbol(e.symbol) ? Origin::kPerThread : Origin::kDefault;
  int n = clang_Cursor_getNumArguments(fn);
  for (int i = 0; i < n; ++i) {
    CXCursor arg = clang_Cursor_getArgument(fn, static_cast<unsigned>(i));
    CXType type = clang_getCursorType(arg);
    CXType canonical = clang_getCanonicalType(type);
    Param p;
    p.name = toString(clang_getCursorSpelling(arg));
    if (p.name.empty()) p.name = "p" + std::to_string(i);
    p.type = toString(clang_getTypeSpelling(type));
    p.canonicalType = toString(clang_getTypeSpelling(canonical));
    p.isPointer = canonical.kind == CXType_Pointer;
    p.pointeeConst = p.isPointer && clang_isConstQualifiedType(clang_getPointeeType(canonical)) != 0;
    p.isStream = isStreamType(type);
    p.kind = kindOf(canonical);
    if (p.isStream && e.streamParam < 0) e.streamParam = i;
    e.params.push_back(std::move(p));
  }
  return e;
}

struct VisitState {
  CXTranslationUnit tu;
  CXFile cudaFile;
  CXFile typedefsFile;
  CXFile profilerFile;          // null when the profiler header is not read
  CXFile profilerTypedefsFile;  // null likewise
  ParsePass* pass;
  std::vector<std::string>* problems;

  bool declaresEntryPoints(CXCursor cursor) const {
    return isInFile(cursor, cudaFile) || (profilerFile != nullptr && isInFile(cursor, profilerFile));
  }
  bool declaresTypedefs(CXCursor cursor) const {
    return isInFile(cursor, typedefsFile) ||
           (profilerTypedefsFile != nullptr && isInFile(cursor, profilerTypedefsFile));
  }
};

void visitMacro(CXCursor cursor, VisitState& st) {
  if (clang_Cursor_isMacroFunctionLike(cursor) != 0) return;
  std::vector<std::string> t = tokensOf(st.tu, cursor);
  if (t.size() == 2 && t[0] == "CUDA_VERSION") {
    st.pass->cudaVersion = std::atoi(t[1].c_str());
    return;
  }
  if (t.empty() || !t[0].starts_with("cu")) return;
  // `#define cuMemAlloc cuMemAlloc_v2`
  if (t.size() == 2 && t[1].starts_with("cu")) {
    st.pass->renames[t[0]] = Rename{t[1], ""};
    return;
  }
  // `#define cuMemcpyHtoD __CUDA_API_PTDS(cuMemcpyHtoD_v2)`: the default build
  // calls the argument, a per-thread build the argument with the suffix
  // (cuda.h: `#define __CUDA_API_PTDS(api) api ## _ptds`).
  if (t.size() == 5 && (t[1] == "__CUDA_API_PTDS" || t[1] == "__CUDA_API_PTSZ") && t[2] == "(" && t[4] == ")") {
    st.pass->renames[t[0]] = Rename{t[3], t[3] + (t[1] == "__CUDA_API_PTDS" ? "_ptds" : "_ptsz")};
  }
}

void visitTypedef(CXCursor cursor, VisitState& st) {
  PfnTypedef td;
  if (!splitTypedefName(toString(clang_getCursorSpelling(cursor)), td)) return;
  CXType pointer = clang_getCanonicalType(clang_getTypedefDeclUnderlyingType(cursor));
  CXType fn = clang_getCanonicalType(clang_getPointeeType(pointer));
  if (pointer.kind != CXType_Pointer || fn.kind != CXType_FunctionProto) {
    st.problems->push_back(td.typedefName + " is not a pointer to a function prototype");
    return;
  }
  std::vector<std::string> args;
  int n = clang_getNumArgTypes(fn);
  for (int i = 0; i < n; ++i) args.push_back(canonicalSpelling(clang_getArgType(fn, static_cast<unsigned>(i))));
  td.canonicalSignature = signatureOf(clang_getResultType(fn), args);
  st.pass->typedefs[td.typedefName] = std::move(td);
}

CXChildVisitResult visitTopLevel(CXCursor cursor, CXCursor, CXClientData data) {
  auto& st = *static_cast<VisitState*>(data);
  switch (clang_getCursorKind(cursor)) {
    case CXCursor_LinkageSpec:
      return CXChildVisit_Recurse;
    case CXCursor_MacroDefinition:
      if (isInFile(cursor, st.cudaFile)) visitMacro(cursor, st);
      break;
    case CXCursor_FunctionDecl: {
      if (!st.declaresEntryPoints(cursor)) break;
      // Static inline helpers (cuGetProcAddress_v2_ptsz in per-thread builds)
      // are compiled into the caller; the driver does not export them.
      if (clang_Cursor_getStorageClass(cursor) == CX_SC_Static || clang_Cursor_isFunctionInlined(cursor) != 0) break;
      EntryPoint e = entryPointOf(cursor);
      if (!e.symbol.starts_with("cu")) break;
      st.pass->functions[e.symbol] = std::move(e);
      break;
    }
    case CXCursor_TypedefDecl:
      if (st.declaresTypedefs(cursor)) visitTypedef(cursor, st);
      break;
    default:
      break;
  }
  return CXChildVisit_Continue;
}

bool wasIncluded(CXTranslationUnit tu, CXFile file) {
  struct Search {
    CXFile file;
    bool found = false;
  } search{file};
  clang_getInclusions(
      tu,
      [](CXFile included, CXSourceLocation*, unsigned, CXClientData data) {
        auto* s = static_cast<Search*>(data);
        if (clang_File_isEqual(included, s->file) != 0) s->found = true;
      },
      &search);
  return search.found;
}

// The file libclang parses: cudaTypedefs.h itself, or, with the profiler
// headers, a file in memory that includes both typedef headers (each includes
// the header it declares the PFNs of).
struct MainFile {
  std::string path;
  std::string contents;  // empty: read `path` from disk
};

MainFile mainFileFor(const ParseOptions& options) {
  if (options.profilerTypedefsHeader.empty()) return {options.typedefsHeader, ""};
  return {"phos-apigen-headers.h", fmt::format("#include \"{}\"\n#include \"{}\"\n", options.typedefsHeader,
                                               options.profilerTypedefsHeader)};
}

// The file `path` as the translation unit read it, or null when it did not.
// clang_getFile also answers for a file the translation unit never read, so
// the inclusion list decides.
CXFile includedFile(CXTranslationUnit tu, const std::string& path) {
  CXFile file = clang_getFile(tu, path.c_str());
  return file != nullptr && wasIncluded(tu, file) ? file : nullptr;
}

Result<ParsePass> runPass(void* index, const ParseOptions& options, const std::vector<std::string>& defines) {
  namespace fs = std::filesystem;
  std::vector<std::string> args = {"-x", "c", "-std=c11",
                                   "-I" + fs::path(options.cudaHeader).parent_path().string()};
  args.insert(args.end(), defines.begin(), defines.end());
  args.insert(args.end(), options.clangArgs.begin(), options.clangArgs.end());
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());

  MainFile main = mainFileFor(options);
  CXUnsavedFile unsaved{main.path.c_str(), main.contents.c_str(), static_cast<unsigned long>(main.contents.size())};
  CXTranslationUnit raw = nullptr;
  CXErrorCode rc = clang_parseTranslationUnit2(
      index, main.path.c_str(), argv.data(), static_cast<int>(argv.size()), main.contents.empty() ? nullptr : &unsaved,
      main.contents.empty() ? 0 : 1,
      CXTranslationUnit_DetailedPreprocessingRecord | CXTranslationUnit_SkipFunctionBodies, &raw);
  if (rc != CXError_Success || raw == nullptr) {
    return makeError(Code::kInternal, "libclang could not parse {} (CXErrorCode {})", options.typedefsHeader,
                     static_cast<int>(rc));
  }
  TuPtr tu(raw);

  std::string errors;
  for (unsigned i = 0, n = clang_getNumDiagnostics(raw); i < n; ++i) {
    CXDiagnostic d = clang_getDiagnostic(raw, i);
    if (clang_getDiagnosticSeverity(d) >= CXDiagnostic_Error) {
      errors += "\n  " + toString(clang_formatDiagnostic(d, clang_defaultDiagnosticDisplayOptions()));
    }
    clang_disposeDiagnostic(d);
  }
  if (!errors.empty()) return makeError(Code::kInvalidArgument, "{} does not compile:{}", options.typedefsHeader, errors);

  CXFile cudaFile = includedFile(raw, options.cudaHeader);
  if (cudaFile == nullptr) {
    return makeError(Code::kInvalidArgument, "{} does not include {} (is it the cudaTypedefs.h of the same toolkit?)",
                     options.typedefsHeader, options.cudaHeader);
  }
  CXFile profilerFile = nullptr;
  CXFile profilerTypedefsFile = nullptr;
  if (!options.profilerHeader.empty()) {
    profilerFile = includedFile(raw, options.profilerHeader);
    profilerTypedefsFile = includedFile(raw, options.profilerTypedefsHeader);
    if (profilerFile == nullptr) {
      return makeError(Code::kInvalidArgument,
                       "{} does not include {} (is it the cudaProfilerTypedefs.h of the same toolkit?)",
                       options.profilerTypedefsHeader, options.profilerHeader);
    }
  }
  ParsePass pass;
  std::vector<std::string> problems;
  VisitState st{raw, cudaFile, clang_getFile(raw, options.typedefsHeader.c_str()), profilerFile, profilerTypedefsFile,
                &pass, &problems};
  clang_visitChildren(clang_getTranslationUnitCursor(raw), visitTopLevel, &st);
  if (!problems.empty()) return makeError(Code::kInvalidArgument, "unexpected declaration: {}", problems.front());
  return pass;
}

Status requireFile(const std::string& path, std::string_view what) {
  std::error_code ec;
  if (path.empty()) return makeError(Code::kInvalidArgument, "no {} given", what);
  if (!std::filesystem::is_regular_file(path, ec)) {
    return makeError(Code::kNotFound, "{} '{}' does not exist or is not a regular file", what, path);
  }
  return Status::ok();
}

}  // namespace

Result<ApiModel> parseHeaders(const ParseOptions& options) {
  RETURN_IF_ERROR(requireFile(options.cudaHeader, "CUDA header"));
  RETURN_IF_ERROR(requireFile(options.typedefsHeader, "typedefs header"));
  if (options.profilerHeader.empty() != options.profilerTypedefsHeader.empty()) {
    return makeError(Code::kInvalidArgument, "the profiler header and its typedefs header go together: give both or neither");
  }
  if (!options.profilerHeader.empty()) {
    RETURN_IF_ERROR(requireFile(options.profilerHeader, "profiler header"));
    RETURN_IF_ERROR(requireFile(options.profilerTypedefsHeader, "profiler typedefs header"));
  }

  IndexPtr index(clang_createIndex(/*excludeDeclarationsFromPCH=*/0, /*displayDiagnostics=*/0));
  // Two configurations, because no single one declares every exported symbol:
  // an ordinary include sees the current names (with deprecation attributes);
  // __CUDA_API_VERSION_INTERNAL, the driver's own build, additionally declares
  // the _ptds/_ptsz variants and the older ABI revisions ("CUDA API versioning
  // support" at the end of cuda.h) together with their PFN typedefs.
  ASSIGN_OR_RETURN(ParsePass plain, runPass(index.get(), options, {}));
  ASSIGN_OR_RETURN(ParsePass internal, runPass(index.get(), options, {"-D__CUDA_API_VERSION_INTERNAL"}));

  ApiModel model;
  model.cudaHeader = options.cudaHeader;
  model.typedefsHeader = options.typedefsHeader;
  model.profilerHeader = options.profilerHeader;
  model.cudaVersion = plain.cudaVersion;
  if (model.cudaVersion == 0) {
    return makeError(Code::kInvalidArgument, "{} defines no CUDA_VERSION: not a CUDA Driver API header",
                     options.cudaHeader);
  }

  std::map<std::string, EntryPoint> all = std::move(plain.functions);
  for (auto& [symbol, e] : internal.functions) {
    auto it = all.find(symbol);
    if (it == all.end()) {
      if (e.origin == Origin::kDefault) e.origin = Origin::kLegacy;
      all.emplace(symbol, std::move(e));
    } else if (it->second.canonicalSignature() != e.canonicalSignature()) {
      return makeError(Code::kInvalidArgument, "{} is declared as {} and, under __CUDA_API_VERSION_INTERNAL, as {}",
                       symbol, it->second.canonicalSignature(), e.canonicalSignature());
    }
  }
  if (all.empty()) return makeError(Code::kInvalidArgument, "{} declares no cu* functions", options.cudaHeader);
  for (auto& [symbol, e] : all) model.entryPoints.push_back(std::move(e));

  std::map<std::string, PfnTypedef> typedefs = std::move(plain.typedefs);
  typedefs.merge(internal.typedefs);
  for (auto& [name, td] : typedefs) model.typedefs.push_back(std::move(td));

  // The internal pass sees every rename (the per-thread block is active there).
  model.renames = std::move(internal.renames);
  return model;
}

}  // namespace phos::apigen
