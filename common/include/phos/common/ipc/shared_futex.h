// SPDX-License-Identifier: Apache-2.0
// Futexes on words that live in a mapping shared by two processes (the call
// ring, its transfer lanes, host-call queues): shared, not FUTEX_PRIVATE.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace phos::ipc {

// Wakes every process and thread sleeping on `word`.
inline void futexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Sleeps while *word == expected, at most `timeout`. Spurious returns are
// fine: every caller re-checks its condition.
inline void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::milliseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000), static_cast<long>((timeout.count() % 1000) * 1000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

}  // namespace phos::ipc
