// SPDX-License-Identifier: Apache-2.0
// The source scanner behind `phos-instrument scan`: Clang reads .cu files and reports
// each __global__ function's PTX name and the pointers in its parameters.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "phos/common/status.h"
#include "phos/instrument/signature.h"

namespace phos::instrument::scan {

struct ScanOptions {
  std::vector<std::string> includeDirs;  // -I, searched before the built-in CUDA stubs
  std::vector<std::string> defines;      // -D: "NAME" or "NAME=VALUE"
  // A directory holding compile_commands.json: the -I/-isystem/-D/-U/-include/-std
  // flags of each file's entry are used (the rest, nvcc's own flags, is dropped).
  std::string compileCommandsDir;
  std::vector<std::string> extraArgs;  // passed to clang as they are
  bool verbose = false;                // print clang's diagnostics as it emits them
  // Receives warnings (parse errors in a file, a kernel skipped and why); by
  // default they go to stderr prefixed with "phos-instrument scan: warning: ".
  std::function<void(std::string_view)> onWarning;
};

// Parses `files` with Clang in CUDA host mode over a built-in prelude that stands in
// for the CUDA headers, and returns one DeclaredKernel per __global__ function and per
// instantiation of a __global__ template, named as nvcc names it in PTX.
// Errors: kNotFound for a missing file, kInvalidArgument for an unreadable
// compile_commands.json, kFailedPrecondition when Clang could not parse a file at all.
// Errors inside function bodies are only warnings: signatures come from declarations.
Result<std::vector<DeclaredKernel>> scanSources(const std::vector<std::string>& files,
                                                const ScanOptions& options);

}  // namespace phos::instrument::scan
