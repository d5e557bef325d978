# SPDX-License-Identifier: Apache-2.0
"""The GoogleTest clients of tests/shim/clients, run under libphos.so against a private phosd.

shim_semantics_test: posted launches, synchronizing calls, deferred errors,
per-thread default streams, pinned and managed memory, large pageable copies (transfer lanes), generated out arrays, refused JIT options, what a capture refuses. shim_threads_test: eight threads
with their own or a shared context, and per-thread context stacks.
shim_pools_test: the stream-ordered allocator's pools, and shim_jit_test: JIT
options, their logs and the linker (both also run on vgpu alone by meson). The
assertions are in the C++ tests; here each program must run every one of its
tests (none skipped or filtered away) and pass.
"""
import re
import subprocess

import pytest

PROGRAMS = {
    "shim_semantics_test": 13,
    "shim_threads_test": 3,
    "shim_pools_test": 9,
    "shim_jit_test": 10,
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_gtest_client_passes_under_phos(program, shim_clients, phosd):
    r = subprocess.run([str(shim_clients / program)], env=phosd.client_env(), capture_output=True, text=True,
                       timeout=120)
    report = r.stdout + r.stderr
    assert r.returncode == 0, report
    ran = re.search(r"^\[==========\] (\d+) tests? from \d+ test suites? ran", r.stdout, re.MULTILINE)
    assert ran and int(ran.group(1)) == PROGRAMS[program], report
    assert f"[  PASSED  ] {PROGRAMS[program]} test" in r.stdout, report
    assert "SKIPPED" not in r.stdout, report
    # libphos.so's own messages never reach the application's stderr.
    assert r.stderr == "", report
