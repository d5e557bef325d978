// SPDX-License-Identifier: Apache-2.0
#include "phos/common/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <initializer_list>

namespace phos {
namespace {

const char* gWho = "phos";

// Only async-signal-safe calls below: snprintf into a local buffer is not
// formally among them, but formats no floating point and takes no lock in glibc.
void report(int sig, siginfo_t* info, void*) {
  char line[256];
  int n = std::snprintf(line, sizeof(line), "%s (pid %d): fatal signal %d (%s) at address %p; stack:\n", gWho,
                        static_cast<int>(getpid()), sig, sigabbrev_np(sig) != nullptr ? sigabbrev_np(sig) : "?",
                        info != nullptr ? info->si_addr : nullptr);
  if (n > 0) (void)!write(STDERR_FILENO, line, static_cast<size_t>(n));
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  // SA_RESETHAND restored the default action: returning re-runs the faulting
  // instruction, which now kills the process with the same signal.
}

}  // namespace

void installCrashReport(const char* who) {
  gWho = who;
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  struct sigaction action {};
  action.sa_sigaction = report;
  action.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) sigaction(sig, &action, nullptr);
}

}  // namespace phos
