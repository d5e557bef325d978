// SPDX-License-Identifier: Apache-2.0
// phos-apigen: parses cuda.h, cudaProfiler.h and their typedef headers, builds the API model, runs the requested emitters.
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "directions.h"
#include "emitters.h"
#include "header_parser.h"
#include "version_map.h"

namespace {

constexpr std::string_view kUsage =
    "usage: phos-apigen --cuda-h PATH --typedefs-h PATH [--profiler-h PATH --profiler-typedefs-h PATH]\n"
    "                   [--clang-arg ARG]... [--directions PATH]\n"
    "                   [--entry-points-h OUT] [--table-cpp OUT] [--trampolines-cpp OUT]\n"
    "                   [--export-map OUT] [--json OUT] [--stats]\n"
    "Reads the CUDA Driver API headers and writes the requested generated files.\n";

struct Options {
  phos::apigen::ParseOptions parse;
  std::string directions;  // the parameter-direction override table (JSON)
  std::string entryPointsHeader;
  std::string tableSource;
  std::string trampolines;
  std::string exportMap;
  std::string json;
  bool stats = false;
  bool help = false;
};

phos::Result<Options> parseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--stats") {
      o.stats = true;
      continue;
    }
    if (arg == "--help" || arg == "-h") {
      o.help = true;
      return o;
    }
    std::string* target = nullptr;
    if (arg == "--cuda-h") {
      target = &o.parse.cudaHeader;
    } else if (arg == "--typedefs-h") {
      target = &o.parse.typedefsHeader;
    } else if (arg == "--profiler-h") {
      target = &o.parse.profilerHeader;
    } else if (arg == "--profiler-typedefs-h") {
      target = &o.parse.profilerTypedefsHeader;
    } else if (arg == "--clang-arg") {
      target = &o.parse.clangArgs.emplace_back();
    } else if (arg == "--directions") {
      target = &o.directions;
    } else if (arg == "--entry-points-h") {
      target = &o.entryPointsHeader;
    } else if (arg == "--table-cpp") {
      target = &o.tableSource;
    } else if (arg == "--trampolines-cpp") {
      target = &o.trampolines;
    } else if (arg == "--export-map") {
      target = &o.exportMap;
    } else if (arg == "--json") {
      target = &o.json;
    } else {
      return phos::makeError(phos::Code::kInvalidArgument, "unknown option '{}'", arg);
    }
    if (i + 1 >= argc) return phos::makeError(phos::Code::kInvalidArgument, "{} needs a value", arg);
    *target = argv[++i];
  }
  if (o.parse.cudaHeader.empty() || o.parse.typedefsHeader.empty()) {
    return phos::makeError(phos::Code::kInvalidArgument, "--cuda-h and --typedefs-h are required");
  }
  if (o.entryPointsHeader.empty() && o.tableSource.empty() && o.trampolines.empty() && o.exportMap.empty() &&
      o.json.empty() && !o.stats) {
    return phos::makeError(phos::Code::kInvalidArgument, "nothing to do: name at least one output");
  }
  return o;
}

phos::Status run(const Options& o) {
  using namespace phos::apigen;
  ASSIGN_OR_RETURN(ApiModel model, parseHeaders(o.parse));
  RETURN_IF_ERROR_CTX(buildProcAddressMap(model), "cannot derive the cuGetProcAddress map");
  ASSIGN_OR_RETURN(DirectionStats directions, assignDirections(model, o.directions));
  if (!o.entryPointsHeader.empty()) RETURN_IF_ERROR(emitEntryPointsHeader(model, o.entryPointsHeader));
  if (!o.tableSource.empty()) RETURN_IF_ERROR(emitTableSource(model, o.tableSource));
  if (!o.trampolines.empty()) RETURN_IF_ERROR(emitTrampolines(model, o.trampolines));
  if (!o.exportMap.empty()) RETURN_IF_ERROR(emitExportMap(model, o.exportMap));
  if (!o.json.empty()) RETURN_IF_ERROR(emitJson(model, o.json));
  if (o.stats) {
    size_t variants = 0;
    for (const auto& n : model.procAddress) variants += n.variants.size();
    fmt::print("CUDA_VERSION {}: {} entry points, {} PFN typedefs, {} cuGetProcAddress names ({} variants), "
               "{} entry points without a typedef; {} pointer parameters, {} directions overridden\n",
               model.cudaVersion, model.entryPoints.size(), model.typedefs.size(), model.procAddress.size(), variants,
               model.unversionedSymbols.size(), directions.pointers, directions.overridden);
  }
  return phos::Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  phos::Result<Options> options = parseArgs(argc, argv);
  if (!options.isOk()) {
    fmt::print(stderr, "phos-apigen: error: {}\n", options.status().message());
    fmt::print(stderr, "{}", kUsage);
    return 2;
  }
  if (options->help) {
    fmt::print("{}", kUsage);
    return 0;
  }
  phos::Status status = run(*options);
  if (!status.isOk()) {
    fmt::print(stderr, "phos-apigen: error: {}\n", status.toString());
    return 1;
  }
  return 0;
}
