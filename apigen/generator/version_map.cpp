// SPDX-License-Identifier: Apache-2.0
// Derives the cuGetProcAddress name/version map from cudaTypedefs.h's PFN typedefs.
#include "version_map.h"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>

namespace phos::apigen {
namespace {

bool endsWithRevision(std::string_view s, size_t& cut) {
  size_t v = s.rfind("_v");
  if (v == std::string_view::npos || v + 2 >= s.size()) return false;
  std::string_view digits = s.substr(v + 2);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  cut = v;
  return true;
}

// The ABI revision a symbol name carries: cuMemAlloc is 1, cuMemAlloc_v2 is 2.
int revisionOf(const std::string& symbol) {
  std::string_view s(symbol);
  if (isPerThreadSymbol(symbol)) s.remove_suffix(5);
  size_t cut = 0;
  if (!endsWithRevision(s, cut)) return 1;
  return std::stoi(std::string(s.substr(cut + 2)));
}

struct Candidate {
  const EntryPoint* entry;
  int rank;
};

// The exported symbols a PFN typedef of `publicName` may stand for, oldest ABI
// first: those spelled publicName[_vN][_ptds|_ptsz], then the target of cuda.h's
// rename when it is spelled differently (`#define cuGraphInstantiate
// cuGraphInstantiateWithFlags`): a rename always points at the newest ABI.
std::vector<Candidate> candidatesFor(const ApiModel& model, const std::string& publicName, bool perThread) {
  std::vector<Candidate> out;
  std::set<std::string> seen;
  for (const EntryPoint& e : model.entryPoints) {
    if (e.publicName == publicName && isPerThreadSymbol(e.symbol) == perThread) {
      out.push_back({&e, revisionOf(e.symbol)});
      seen.insert(e.symbol);
    }
  }
  auto rename = model.renames.find(publicName);
  if (rename != model.renames.end()) {
    const std::string& target = perThread ? rename->second.perThreadSymbol : rename->second.defaultSymbol;
    const EntryPoint* e = target.empty() ? nullptr : model.find(target);
    if (e != nullptr && !seen.contains(target)) out.push_back({e, 1 << 20});
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) { return a.rank < b.rank; });
  return out;
}

}  // namespace

bool isPerThreadSymbol(const std::string& symbol) {
  return symbol.ends_with("_ptds") || symbol.ends_with("_ptsz");
}

std::string publicNameOf(const std::string& symbol) {
  std::string_view s(symbol);
  if (isPerThreadSymbol(symbol)) s.remove_suffix(5);
  size_t cut = 0;
  if (endsWithRevision(s, cut)) s = s.substr(0, cut);
  return std::string(s);
}

Status buildProcAddressMap(ApiModel& model) {
  std::map<std::string, std::vector<const PfnTypedef*>> byName;
  for (const PfnTypedef& td : model.typedefs) byName[td.publicName].push_back(&td);

  std::set<std::string> reached;
  model.procAddress.clear();
  for (auto& [publicName, typedefs] : byName) {
    ProcAddressName name{publicName, {}};
    for (bool perThread : {false, true}) {
      std::vector<const PfnTypedef*> tds;
      for (const PfnTypedef* td : typedefs) {
        if (td->perThread == perThread) tds.push_back(td);
      }
      std::sort(tds.begin(), tds.end(), [](auto* a, auto* b) { return a->version < b->version; });
      std::vector<Candidate> cands = candidatesFor(model, publicName, perThread);
      // Versions and revisions grow together: the typedef of the k-th ABI
      // (by version) names the k-th symbol (by revision) with its signature.
      // Matching in order, not by signature alone, tells apart revisions whose
      // signatures are equal (cuCtxCreate and cuCtxCreate_v2, which differ in
      // behaviour, not in types).
      size_t next = 0;
      for (const PfnTypedef* td : tds) {
        size_t j = next;
        while (j < cands.size() && cands[j].entry->canonicalSignature() != td->canonicalSignature) ++j;
        if (j == cands.size()) {
          std::string tried;
          for (const Candidate& c : cands) tried += " " + c.entry->symbol + c.entry->canonicalSignature();
          return makeError(Code::kInvalidArgument, "{} {} matches no declared symbol after the ones already bound; candidates:{}",
                           td->typedefName, td->canonicalSignature, tried.empty() ? " none" : tried);
        }
        name.variants.push_back({td->version, perThread, cands[j].entry->symbol, td->typedefName});
        reached.insert(cands[j].entry->symbol);
        next = j + 1;
      }
    }
    std::stable_sort(name.variants.begin(), name.variants.end(), [](const auto& a, const auto& b) {
      return a.version != b.version ? a.version < b.version : a.perThread < b.perThread;
    });
    model.procAddress.push_back(std::move(name));
  }

  model.unversionedSymbols.clear();
  for (const EntryPoint& e : model.entryPoints) {
    if (!reached.contains(e.symbol)) model.unversionedSymbols.push_back(e.symbol);
  }
  return Status::ok();
}

}  // namespace phos::apigen
