// SPDX-License-Identifier: Apache-2.0
// A process that dies of a fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE) first
// writes to stderr which signal, at which address, and its stack as raw
// return addresses, so that a crash on a machine without a debugger (a GPU
// host lent for minutes) can be located afterwards: `addr2line -f -C -e`
// on an unstripped build of the same commit. Then it dies of the signal.
#pragma once

namespace phos {

// Installs the handlers; `who` (a string literal) starts each report.
void installCrashReport(const char* who);

}  // namespace phos
