// SPDX-License-Identifier: Apache-2.0
// The signatures subcommand: what speculation knows of each kernel of a PTX file.
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "phos/instrument/signature.h"
#include "phos/ptx/parser.h"
#include "subcommands.h"

namespace phos::instrument_tool {

Action addSignaturesCommand(CLI::App& app) {
  struct Options {
    std::string input;
    std::string database;
  };
  auto opts = std::make_shared<Options>();
  app.add_option("file", opts->input, "PTX file ('-' for standard input)")->required();
  app.add_option("-d,--database", opts->database,
                 "signature database (from `phos-instrument scan`) whose declared types to apply");
  return [opts]() -> Status {
    // The database first: a bad one should fail before any analysis work.
    std::optional<instrument::SignatureDatabase> db;
    if (!opts->database.empty()) {
      ASSIGN_OR_RETURN(db, instrument::SignatureDatabase::load(opts->database));
    }
    ASSIGN_OR_RETURN(std::string text, readInput(opts->input));
    ASSIGN_OR_RETURN(ptx::Module mod, ptx::parseModule(text, opts->input));
    Result<std::vector<instrument::KernelSignature>> sigs = instrument::analyzeModule(mod);
    if (!sigs.isOk()) return std::move(sigs).status().withContext(opts->input);
    nlohmann::json kernels = nlohmann::json::array();
    for (instrument::KernelSignature& s : *sigs) {
      if (db) {
        if (const instrument::DeclaredKernel* k = db->find(s.name)) {
          RETURN_IF_ERROR_CTX(instrument::applyDeclaration(s, *k), opts->database);
        }
      }
      kernels.push_back(instrument::toJson(s));
    }
    std::string out = nlohmann::json{{"kernels", kernels}}.dump(2) + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return Status::ok();
  };
}

}  // namespace phos::instrument_tool
