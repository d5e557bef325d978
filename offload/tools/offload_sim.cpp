// SPDX-License-Identifier: Apache-2.0
// phos-offload-sim: generates synthetic checkpoint traces and replays traces through the offload schedulers.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "phos/offload/simulator.h"

namespace {

using namespace phos;
using namespace phos::offload;

constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

constexpr const char* kUsage =
    "usage: phos-offload-sim generate [--kind ramp|stationary] [--snapshots N] [--gpus N]\n"
    "                                 [--seed N] [--out FILE]\n"
    "       phos-offload-sim run --trace FILE [--topology dgx1|nvswitch:N|alltoall:N]\n"
    "                            [--free-mib 80,128,160] [--chunk-bytes N] [--records FILE]\n"
    "generate writes 'snapshot,gpu,bytes' CSV; run prints a JSON summary per free-space\n"
    "setting and scheduler (blocking time relative to exact), and --records writes one\n"
    "CSV row per snapshot, setting and scheduler.\n";

// "--name value" pairs; an unknown name or a missing value is an error.
Result<std::map<std::string, std::string>> parseOptions(int argc, char** argv, int first,
                                                        const std::vector<std::string>& known) {
  std::map<std::string, std::string> out;
  for (int i = first; i < argc; i += 2) {
    std::string name = argv[i];
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return makeError(Code::kInvalidArgument, "unknown option '{}'", name);
    }
    if (i + 1 >= argc) return makeError(Code::kInvalidArgument, "option {} needs a value", name);
    out[name] = argv[i + 1];
  }
  return out;
}

Result<int64_t> parseInt(const std::string& text, const char* what) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size() && v >= 0) return static_cast<int64_t>(v);
  } catch (const std::exception&) {
  }
  return makeError(Code::kInvalidArgument, "{} must be a non-negative integer, got '{}'", what,
                   text);
}

Status writeFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.close();
  if (!f) return makeError(Code::kIo, "cannot write {}: {}", path, std::strerror(errno));
  return Status::ok();
}

int fail(const Status& s) {
  std::fprintf(stderr, "phos-offload-sim: %s\n", s.message().c_str());
  // Everything but a broken invariant comes from the user's options, trace or
  // paths.
  return s.code() == Code::kInternal ? kExitFailure : kExitBadInput;
}

int generate(int argc, char** argv) {
  auto opts = parseOptions(argc, argv, 2, {"--kind", "--snapshots", "--gpus", "--seed", "--out"});
  if (!opts) return fail(opts.status());
  TraceShape shape;
  if (opts->contains("--kind")) {
    const std::string& k = opts->at("--kind");
    if (k == "ramp") {
      shape.kind = TraceKind::kRamp;
    } else if (k != "stationary") {
      return fail(makeError(Code::kInvalidArgument, "--kind is ramp or stationary, not '{}'", k));
    }
  }
  for (const auto& [name, target] :
       std::vector<std::pair<const char*, int*>>{{"--snapshots", &shape.snapshots},
                                                 {"--gpus", &shape.gpus}}) {
    if (!opts->contains(name)) continue;
    auto v = parseInt(opts->at(name), name);
    if (!v) return fail(v.status());
    if (*v < 1 || *v > 100000) {
      return fail(makeError(Code::kInvalidArgument, "{} must be 1..100000", name));
    }
    *target = static_cast<int>(*v);
  }
  if (static_cast<int64_t>(shape.snapshots) * shape.gpus > 10'000'000) {
    return fail(makeError(Code::kInvalidArgument,
                          "{} snapshots x {} GPUs is more than 10 million trace rows",
                          shape.snapshots, shape.gpus));
  }
  if (opts->contains("--seed")) {
    auto v = parseInt(opts->at("--seed"), "--seed");
    if (!v) return fail(v.status());
    shape.seed = static_cast<uint64_t>(*v);
  }
  const std::string csv = traceToCsv(generateTrace(shape));
  if (opts->contains("--out")) {
    Status s = writeFile(opts->at("--out"), csv);
    if (!s.isOk()) return fail(s);
  } else {
    std::fputs(csv.c_str(), stdout);
  }
  return 0;
}

int run(int argc, char** argv) {
  auto opts = parseOptions(argc, argv, 2,
                           {"--trace", "--topology", "--free-mib", "--chunk-bytes", "--records"});
  if (!opts) return fail(opts.status());
  if (!opts->contains("--trace")) {
    return fail(makeError(Code::kInvalidArgument, "run needs --trace FILE"));
  }
  std::ifstream in(opts->at("--trace"));
  if (!in) {
    return fail(makeError(Code::kInvalidArgument, "cannot read trace {}: {}", opts->at("--trace"),
                          std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  auto trace = parseTraceCsv(text.str());
  if (!trace) return fail(trace.status());
  auto topology = topologyByName(opts->contains("--topology") ? opts->at("--topology") : "dgx1");
  if (!topology) return fail(topology.status());

  std::vector<int64_t> free(kPaperFreeBytes.begin(), kPaperFreeBytes.end());
  if (opts->contains("--free-mib")) {
    free.clear();
    std::stringstream list(opts->at("--free-mib"));
    for (std::string item; std::getline(list, item, ',');) {
      auto v = parseInt(item, "--free-mib");
      if (!v) return fail(v.status());
      if (*v > (int64_t{1} << 40)) {
        return fail(makeError(Code::kInvalidArgument, "--free-mib {} is too large", *v));
      }
      free.push_back(*v << 20);
    }
  }
  int64_t chunk = 1 << 20;  // the paper's granularity
  if (opts->contains("--chunk-bytes")) {
    auto v = parseInt(opts->at("--chunk-bytes"), "--chunk-bytes");
    if (!v) return fail(v.status());
    chunk = *v;
  }

  auto records = simulate(*trace, *topology, free, chunk);
  if (!records) return fail(records.status());
  if (opts->contains("--records")) {
    std::string csv = "snapshot,free_bytes,scheduler,blocking_seconds,solve_seconds\n";
    for (const SimulationRecord& r : *records) {
      csv += fmt::format("{},{},{},{:.9g},{:.9g}\n", r.snapshot, r.freeBytes,
                         schedulerName(r.scheduler), r.blockingSeconds, r.solveSeconds);
    }
    Status s = writeFile(opts->at("--records"), csv);
    if (!s.isOk()) return fail(s);
  }
  nlohmann::json out = {{"topology", topology->name},
                        {"chunk_bytes", chunk},
                        {"settings", summarize(*records)}};
  std::puts(out.dump(2).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "generate") return generate(argc, argv);
  if (cmd == "run") return run(argc, argv);
  if (cmd == "--help" || cmd == "-h") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::fputs(kUsage, stderr);
  return kExitBadInput;
}
