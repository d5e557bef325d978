# SPDX-License-Identifier: Apache-2.0
"""`nm -D --defined-only libphos.so` lists exactly apigen's entry points plus dlopen, libc's open family and the SDK's entry.

tests/shim/exports_test.cpp checks the same with the project's ELF reader;
this asks binutils, so a bug in that reader cannot hide an extra export.
"""
import json
import pathlib
import shutil
import stat
import subprocess
import sys

import pytest


# The interposed libc functions (shim/src/device_files.cpp for the open family); the application SDK's entry.
EXTRA = {"dlopen", "open", "open64", "openat", "openat64", "__open_2", "__open64_2", "phos_sdk_checkpoint"}


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


def test_nvidias_device_files_are_refused_to_the_application(phos, phosd, tmp_path):
    """Under phos run, a process cannot open /dev/nvidia*: its GPU is phosd's,
    and CRIU dumps no such file (NVML's, which PyTorch opens). Other files
    open as before, through each entry of the open family."""
    import os
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    node = pathlib.Path("/dev/nvidia-phos-test")
    if not node.exists():
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    try:
        script = (
            "import ctypes, os, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "for path in (sys.argv[1], '/dev/null'):\n"
            "    for how in ('open', 'open64', 'openat', 'openat64', '__open_2', '__open64_2'):\n"
            "        f = getattr(libc, how)\n"
            "        args = (-100, path.encode(), os.O_RDONLY) if 'at' in how else (path.encode(), os.O_RDONLY)\n"
            "        fd = f(*args)\n"
            "        print(path, how, 'fd' if fd >= 0 else os.strerror(ctypes.get_errno()))\n"
            "        if fd >= 0: os.close(fd)\n")
        direct = subprocess.run([sys.executable, "-c", script, str(node)], capture_output=True, text=True, timeout=60)
        assert direct.returncode == 0, direct.stderr
        assert "No such file" not in direct.stdout, direct.stdout
        under = subprocess.run([str(phos), "run", "--runtime-dir", phosd.runtime_dir, "--", sys.executable, "-c",
                                script, str(node)], capture_output=True, text=True, timeout=60)
        assert under.returncode == 0, under.stderr
        lines = under.stdout.splitlines()
        assert lines[:6] == [f"{node} {how} No such file or directory" for how in
                             ("open", "open64", "openat", "openat64", "__open_2", "__open64_2")], under.stdout
        assert lines[6:] == [f"/dev/null {how} fd" for how in
                             ("open", "open64", "openat", "openat64", "__open_2", "__open64_2")], under.stdout
    finally:
        node.unlink(missing_ok=True)
