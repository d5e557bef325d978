// SPDX-License-Identifier: Apache-2.0
// CRIU discovery: environment, build option, project install, PATH.
#include "phos/criu/criu.h"

#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "phos/common/subprocess.h"

#ifndef PHOS_CRIU_CONFIGURED
#define PHOS_CRIU_CONFIGURED ""
#endif

namespace phos::criu {

namespace {
constexpr const char* kProjectInstall = "/opt/phos/criu/bin/criu";
// Executable by root and group phos only, with cap_checkpoint_restore=ep.
constexpr const char* kProjectUserInstall = "/opt/phos/criu/bin/criu-user";
}  // namespace

std::vector<std::string> CriuBinary::command(std::vector<std::string> args) const {
  args.insert(args.begin(), path);
  // PhOS's own CRIU runs take the GPU half through their hooks: PhOS's CRIU
  // plugin, if an administrator installed it in CRIU's plugin directory,
  // stands aside for them (docs/containers.md).
  args.insert(args.begin(), {"/usr/bin/env", std::string(kPluginOffVariable) + "=off"});
  if (unprivileged) args.emplace_back("--unprivileged");
  return args;
}

std::vector<std::string> candidatePaths() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("PHOS_CRIU"); env != nullptr && *env != '\0') {
    paths.emplace_back(env);
  }
  if (*PHOS_CRIU_CONFIGURED != '\0') paths.emplace_back(PHOS_CRIU_CONFIGURED);
  if (geteuid() != 0) paths.emplace_back(kProjectUserInstall);
  paths.emplace_back(kProjectInstall);
  paths.emplace_back("criu");
  return paths;
}

Result<CriuBinary> parseVersion(std::string path, std::string_view output) {
  constexpr std::string_view kTag = "Version: ";
  size_t at = output.find(kTag);
  if (at == std::string_view::npos) {
    return makeError(Code::kInvalidArgument, "'{}' did not print a version", path);
  }
  std::string_view rest = output.substr(at + kTag.size());
  rest = rest.substr(0, rest.find_first_of(" \n"));
  CriuBinary criu{std::move(path), std::string(rest), 0, 0};
  const char* begin = rest.data();
  const char* end = begin + rest.size();
  auto [p, ec] = std::from_chars(begin, end, criu.major);
  if (ec != std::errc() || p == end || *p != '.') {
    return makeError(Code::kInvalidArgument, "'{}' printed an unparsable version '{}'",
                     criu.path, rest);
  }
  auto [p2, ec2] = std::from_chars(p + 1, end, criu.minor);
  if (ec2 != std::errc()) {
    return makeError(Code::kInvalidArgument, "'{}' printed an unparsable version '{}'",
                     criu.path, rest);
  }
  return criu;
}

Result<CriuBinary> locate() {
  std::string why;
  for (const std::string& path : candidatePaths()) {
    if (path.find('/') != std::string::npos && access(path.c_str(), X_OK) != 0) {
      why += fmt::format("\n  {}: not an executable file", path);
      continue;
    }
    auto run = runCapture({path, "--version"});
    if (!run) {
      why += fmt::format("\n  {}: {}", path, run.status().message());
      continue;
    }
    if (run->exitCode != 0) {
      why += fmt::format("\n  {}: --version exited with {}", path, run->exitCode);
      continue;
    }
    auto parsed = parseVersion(path, run->out);
    if (!parsed) {
      why += fmt::format("\n  {}: {}", path, parsed.status().message());
      continue;
    }
    if (parsed->major < kMinimumMajor) {
      why += fmt::format("\n  {}: version {} is older than {}.0", path, parsed->version,
                         kMinimumMajor);
      continue;
    }
    parsed->unprivileged = path == kProjectUserInstall;
    return parsed;
  }
  return makeError(Code::kNotFound,
                   "no usable CRIU (>= {}.0) found; run scripts/install-criu or set "
                   "PHOS_CRIU. Tried:{}",
                   kMinimumMajor, why);
}

Status checkPrivilege(const CriuBinary& criu) {
  if (::geteuid() == 0 || criu.unprivileged) return Status::ok();
  constexpr int kCheckpointRestore = 40, kSysAdmin = 21;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (!line.starts_with("CapEff:")) continue;
    const uint64_t effective = std::strtoull(line.c_str() + 7, nullptr, 16);
    if ((effective >> kCheckpointRestore & 1) != 0 || (effective >> kSysAdmin & 1) != 0) return Status::ok();
  }
  return makeError(Code::kPermissionDenied,
                   "uid {} may not run CRIU ({}): it needs CAP_CHECKPOINT_RESTORE, which {} has, for root and the "
                   "members of group phos only (scripts/install-criu; docs/security.md)",
                   ::geteuid(), criu.path, kProjectUserInstall);
}

Status check(const CriuBinary& criu) {
  ASSIGN_OR_RETURN(auto run, runCapture(criu.command({"check"})));
  std::string all = run.out + run.err;
  if (run.exitCode == 0 && all.find("Looks good") != std::string::npos) return Status::ok();
  return makeError(Code::kFailedPrecondition, "'{} check' failed (exit {}): {}", criu.path,
                   run.exitCode, all);
}

std::string lastWords(const ProcessOutput& run) {
  std::string said = run.out + run.err;
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  if (const size_t cut = said.rfind('\n'); cut != std::string::npos) said = said.substr(cut + 1);
  return said.empty() ? fmt::format("exit {}", run.exitCode) : said;
}

Status checkLazyPages(const CriuBinary& criu) {
  ASSIGN_OR_RETURN(auto run, runCapture(criu.command({"check", "--feature", "uffd-noncoop"})));
  if (run.exitCode == 0) return Status::ok();
  return makeError(Code::kFailedPrecondition,
                   "CRIU cannot load memory on demand here (criu check --feature uffd-noncoop: {})", lastWords(run));
}

}  // namespace phos::criu
