// SPDX-License-Identifier: Apache-2.0
// phos checkpoint and phos migrate wait for a session busy with another
// checkpoint, or loading its memory after a concurrent restore.
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>

#include "subcommands.h"

namespace phos::cli {

// How long a command waits for a busy session.
inline constexpr std::chrono::seconds kBusyWait{600};

// Runs `attempt` until it returns without setting `busy` (phosd's words when
// the session was busy and nothing was done), every 100 ms for at most
// kBusyWait; says once on stderr that it waits (unless `quiet`).
inline int retryWhileBusy(const char* command, bool quiet, const std::function<int(std::string& busy)>& attempt) {
  const auto giveUp = std::chrono::steady_clock::now() + kBusyWait;
  bool told = false;
  for (;;) {
    std::string busy;
    const int code = attempt(busy);
    if (busy.empty()) return code;
    if (std::chrono::steady_clock::now() > giveUp) {
      std::fprintf(stderr, "phos %s: %s (waited %lld s)\n", command, busy.c_str(),
                   static_cast<long long>(kBusyWait.count()));
      return kExitFailure;
    }
    if (!told && !quiet) {
      std::fprintf(stderr, "phos %s: %s; waiting for it to finish\n", command, busy.c_str());
      told = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace phos::cli
