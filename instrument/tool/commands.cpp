// SPDX-License-Identifier: Apache-2.0
// The print and params subcommands of phos-instrument.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "phos/ptx/params.h"
#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"
#include "subcommands.h"

namespace phos::instrument_tool {

Result<std::string> readInput(const std::string& path) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), {});
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return errnoError(errno, "cannot open " + path);
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return errnoError(errno, "cannot read " + path);
  return buf.str();
}

Status writeOutput(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return Status::ok();
  }
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) return errnoError(errno, "cannot write " + path);
  return Status::ok();
}

Action addPrintCommand(CLI::App& app) {
  struct Options {
    std::string input;
    std::string output;
  };
  auto opts = std::make_shared<Options>();
  app.add_option("file", opts->input, "PTX file ('-' for standard input)")->required();
  app.add_option("-o,--output", opts->output, "write here instead of standard output");
  return [opts]() -> Status {
    ASSIGN_OR_RETURN(std::string text, readInput(opts->input));
    ASSIGN_OR_RETURN(ptx::Module mod, ptx::parseModule(text, opts->input));
    return writeOutput(opts->output, ptx::print(mod));
  };
}

Action addParamsCommand(CLI::App& app) {
  struct Options {
    std::string input;
    std::string kernel;
  };
  auto opts = std::make_shared<Options>();
  app.add_option("file", opts->input, "PTX file ('-' for standard input)")->required();
  app.add_option("-k,--kernel", opts->kernel, "only this kernel");
  return [opts]() -> Status {
    ASSIGN_OR_RETURN(std::string text, readInput(opts->input));
    ASSIGN_OR_RETURN(ptx::Module mod, ptx::parseModule(text, opts->input));
    ASSIGN_OR_RETURN(std::vector<ptx::ParamLayout> layouts, ptx::computeParamLayouts(mod));
    nlohmann::json kernels = nlohmann::json::array();
    bool found = false;
    for (const ptx::ParamLayout& l : layouts) {
      if (!opts->kernel.empty() && l.kernel != opts->kernel) continue;
      found = true;
      nlohmann::json params = nlohmann::json::array();
      for (const ptx::ParamInfo& p : l.params) {
        params.push_back({{"ordinal", p.ordinal},
                          {"name", p.name},
                          {"offset", p.offset},
                          {"size", p.size},
                          {"alignment", p.alignment},
                          {"type", std::string(ptx::name(p.type))},
                          {"may_be_pointer", p.mayBePointer}});
      }
      kernels.push_back({{"kernel", l.kernel}, {"size", l.totalSize}, {"params", params}});
    }
    if (!opts->kernel.empty() && !found) {
      return makeError(Code::kNotFound, "no kernel named '{}' in {}", opts->kernel, opts->input);
    }
    return writeOutput("-", kernels.dump(2) + "\n");
  };
}

}  // namespace phos::instrument_tool
