# SPDX-License-Identifier: Apache-2.0
"""`nm -D --defined-only libphos.so` lists exactly apigen's entry points plus dlopen and the SDK's entry.

tests/shim/exports_test.cpp checks the same with the project's ELF reader;
this asks binutils, so a bug in that reader cannot hide an extra export.
"""
import json
import shutil
import subprocess

import pytest


EXTRA = {"dlopen", "phos_sdk_checkpoint"}  # the interposed libc function; the application SDK's entry


def test_nm_lists_the_entry_points_and_dlopen(build_dir):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    libphos = build_dir / "shim" / "libphos.so"
    if not libphos.exists():
        pytest.skip(f"libphos.so was not built in {build_dir}")
    r = subprocess.run([nm, "-D", "--defined-only", str(libphos)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    exported = set()
    for line in r.stdout.splitlines():
        address, kind, name = line.split()
        # Only code and data the dynamic linker binds to: no stray objects.
        assert kind in ("T", "W"), line
        exported.add(name.split("@")[0])

    generated = build_dir / "apigen" / "include" / "phos" / "cuda_api"
    entry_points = {e["symbol"] for e in json.loads((generated / "cuda_api.json").read_text())["entryPoints"]}
    assert exported == entry_points | EXTRA

    version_script = (generated / "cuda_api.map").read_text()
    globals_part = version_script.split("global:", 1)[1].split("local:", 1)[0]
    assert exported == {w.rstrip(";") for w in globals_part.split()} | EXTRA
