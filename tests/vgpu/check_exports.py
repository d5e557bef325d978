#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Checks that libcuda.so.1 exports exactly the generated entry-point list, and nothing but cu* functions,
# and that no entry point is defined as a C++ function.
"""Usage: check_exports.py NM LIBCUDA EXPECTED_LIST"""
import re
import subprocess
import sys


def main() -> int:
    nm, lib, expected_list = sys.argv[1:4]
    out = subprocess.run([nm, '-D', '--defined-only', lib], check=True, capture_output=True, text=True).stdout
    exported = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        exported.add(parts[2].split('@')[0])
    exported.discard('')
    expected = {n.strip() for n in open(expected_list, encoding='utf-8') if n.strip()}
    foreign = sorted(n for n in exported if not n.startswith('cu'))
    missing = sorted(expected - exported)
    # The per-thread and legacy aliases vgpu defines are part of the generated
    # list too; anything else is an accidental export.
    extra = sorted(exported - expected)
    ok = True
    if foreign:
        print(f'non-cu* symbols exported: {foreign[:20]}')
        ok = False
    if missing:
        print(f'{len(missing)} entry points of cuda.h and cudaProfiler.h are not exported: {missing[:20]}')
        ok = False
    if extra:
        print(f'{len(extra)} exported cu* symbols are not entry points of cuda.h or cudaProfiler.h: {extra[:20]}')
        ok = False
    # An entry point defined without cuda.h's (or an explicit) extern "C"
    # declaration is a C++ function the weak NOT_SUPPORTED one hides.
    local = subprocess.run([nm, '-C', '--defined-only', lib], check=True, capture_output=True, text=True).stdout
    mangled = sorted({m.group(1) for m in re.finditer(r' [tT] (cu[A-Z]\w*)\(', local)})
    if mangled:
        print(f'entry points defined with C++ linkage (declare them extern "C"): {mangled[:20]}')
        ok = False
    print(f'{len(exported)} symbols exported, {len(expected)} expected')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
