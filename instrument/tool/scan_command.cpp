// SPDX-License-Identifier: Apache-2.0
// `phos-instrument scan`: writes the signature database of the __global__ functions
// in an application's .cu sources (see docs/speculation.md).
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "phos/instrument/signature.h"
#include "subcommands.h"
#ifdef PHOS_HAVE_SCAN
#include "source_scanner.h"
#endif

namespace phos::instrument_tool {
namespace {

struct ScanCommandOptions {
  std::vector<std::string> sources;
  std::string output;
  bool merge = false;
  bool allowEmpty = false;
  bool verbose = false;
  std::vector<std::string> includeDirs;
  std::vector<std::string> defines;
  std::string buildDir;
  std::vector<std::string> clangArgs;
};

#ifdef PHOS_HAVE_SCAN
// Written next to the target and renamed over it, so a failed write never leaves a
// truncated database for phosd to load.
Status writeDatabase(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return Status::ok();
  }
  std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) return errnoError(errno, "cannot write " + path);
    out << text;
    out.flush();
    if (!out) {
      int saved = errno;
      std::filesystem::remove(temporary);
      return errnoError(saved, "cannot write " + path);
    }
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    std::filesystem::remove(temporary);
    return Status(Code::kIo, "cannot write " + path + ": " + ec.message());
  }
  return Status::ok();
}

Status runScan(const ScanCommandOptions& opts) {
  instrument::SignatureDatabase database;
  bool writingFile = !opts.output.empty() && opts.output != "-";
  if (opts.merge) {
    if (!writingFile) return Status(Code::kInvalidArgument, "--merge needs -o FILE");
    std::error_code ec;
    if (std::filesystem::exists(opts.output, ec)) {
      ASSIGN_OR_RETURN(database, instrument::SignatureDatabase::load(opts.output));
    }
  }
  // Fail on an output we cannot create before spending seconds in clang.
  if (writingFile) {
    std::filesystem::path parent = std::filesystem::absolute(opts.output).parent_path();
    std::error_code ec;
    if (!std::filesystem::is_directory(parent, ec)) {
      return makeError(Code::kNotFound, "cannot write {}: no directory {}", opts.output,
                       parent.string());
    }
  }

  instrument::scan::ScanOptions scanOptions;
  scanOptions.includeDirs = opts.includeDirs;
  scanOptions.defines = opts.defines;
  scanOptions.compileCommandsDir = opts.buildDir;
  scanOptions.extraArgs = opts.clangArgs;
  scanOptions.verbose = opts.verbose;
  ASSIGN_OR_RETURN(std::vector<instrument::DeclaredKernel> kernels,
                   instrument::scan::scanSources(opts.sources, scanOptions));
  if (kernels.empty() && !opts.allowEmpty) {
    // Almost always the wrong files or a missing -D; an empty database would silently
    // leave speculation without source facts.
    return Status(Code::kNotFound,
                  "no __global__ functions in the given sources; nothing written "
                  "(--allow-empty writes an empty database)");
  }
  for (instrument::DeclaredKernel& kernel : kernels) database.add(std::move(kernel));
  return writeDatabase(opts.output, database.toJson());
}
#endif

}  // namespace

Action addScanCommand(CLI::App& app) {
  auto opts = std::make_shared<ScanCommandOptions>();
  app.add_option("sources", opts->sources, ".cu source files")->required();
  app.add_option("-o,--output", opts->output,
                 "write the database here (default: standard output); replaced unless --merge");
  app.add_flag("--merge", opts->merge,
               "add to the database already in -o FILE (same-named kernels are replaced)");
  app.add_option("-I,--include", opts->includeDirs, "add an include directory");
  app.add_option("-D,--define", opts->defines, "define a macro: NAME or NAME=VALUE");
  app.add_option("-p,--build-dir", opts->buildDir,
                 "take include paths and macros from BUILD_DIR/compile_commands.json");
  app.add_option("--clang-arg", opts->clangArgs, "pass an argument to clang as it is");
  app.add_flag("--allow-empty", opts->allowEmpty,
               "write an empty database when no __global__ function is found");
  app.add_flag("-v,--verbose", opts->verbose, "print clang's diagnostics");
#ifdef PHOS_HAVE_SCAN
  return [opts]() -> Status { return runScan(*opts); };
#else
  return []() -> Status {
    return Status(Code::kNotSupported,
                  "this phos-instrument was built without Clang's libTooling: install "
                  "libclang-cpp14-dev (apt-get install libclang-cpp14-dev) and reconfigure");
  };
#endif
}

}  // namespace phos::instrument_tool
