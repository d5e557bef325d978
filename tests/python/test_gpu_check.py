# SPDX-License-Identifier: Apache-2.0
"""The dry run of scripts/gpu-check (docs/gpu.md): the bundle that goes to a GPU
host builds here, and the check's whole sequence runs from it on vgpu, so that
it works whenever a GPU host is there. Each job (Driver API, validated twins,
nvcc, cuda.core, CuPy, numba-cuda) runs directly and under phos run, is checkpointed with
stop-the-world, copy-on-write and recopy while it runs, and each image is
restored; the check itself compares every run with the direct one."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def bundle(build_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-bundle") / "bundle"
    r = subprocess.run([str(ROOT / "scripts/gpu-bundle"), "--builddir", str(build_dir), "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_the_bundle_runs_without_the_build_tree(bundle):
    """Its programs find their libraries beside them (no path into the build or the host's own
    spdlog or fmt), and it stays under 60 MiB."""
    for program in ("bin/phos", "lib/libphos.so", "jobs/mlp-train"):
        ldd = subprocess.run(["ldd", str(bundle / program)], capture_output=True, text=True, check=True).stdout
        for lib in ("libspdlog", "libfmt"):
            line = next((x for x in ldd.splitlines() if lib in x), None)
            assert line is None or str(bundle) in line, (program, line)
        assert "/build/" not in ldd, ldd
    assert subprocess.run([str(bundle / "criu/criu"), "--version"], capture_output=True, text=True,
                          check=True).stdout.startswith("Version: 4.")
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    assert size < 60 << 20, size


def test_the_gpu_check_passes_on_vgpu(bundle, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "scripts/gpu-check"), str(out), "--vgpu", "--bundle", str(bundle)],
                       capture_output=True, text=True, timeout=600)
    results = json.loads((out / "gpu-check.json").read_text())
    assert r.returncode == 0, r.stdout + r.stderr + (out / "gpu-check.log").read_text()[-8000:]
    assert results["failed"] == [] and results["skipped"] == ["pytorch"], results
    assert set(results["passed"]) == {"host", "remoting", "driver-api", "twins", "nvcc", "corpus", "cuda-core",
                                      "cupy", "numba"}, results
    for part in results["parts"]:
        if part["name"] in ("host", "pytorch", "remoting", "corpus"):
            continue
        figures = part["figures"]
        for mode in ("stop", "cow", "recopy"):
            assert figures[mode]["gpu_stall_seconds"] > 0 and figures[mode]["restored_run_seconds"] > 0, \
                (part["name"], mode)
    # The copy benchmark checked its data both ways, directly and under phos; the launch benchmark ran both ways
    # (three launches and two captured graphs).
    remoting = next(p for p in results["parts"] if p["name"] == "remoting")["figures"]
    assert all(c["ratio"] > 0 for c in remoting["copies"].values()) and len(remoting["launch"]) == 5, remoting
    assert "passed: host remoting driver-api twins nvcc corpus cuda-core cupy numba" in r.stdout, r.stdout
    # The corpus's dry run: two nvcc programs and the table probe, alike directly and under phos.
    corpus = next(p for p in results["parts"] if p["name"] == "corpus")["programs"]
    assert sorted(corpus) == ["export-table-probe", "graphs", "vector_add"], corpus
    assert all(c["same"] and c["validated_same"] and c["direct"]["rc"] == 0 for c in corpus.values()), corpus
    # Every launch of the validated job ran as a twin, in the original session and the three restored ones.
    twins = next(p for p in results["parts"] if p["name"] == "twins")["figures"]
    assert len(twins["validated_sessions"]) == 4 and twins["twin_modules_loaded"] == 4, twins
    for name in ("gpu-check.log", "phosd.log"):
        assert (out / name).stat().st_size > 0, name


def test_the_gpu_check_names_a_missing_bundle(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts/gpu-check"), str(tmp_path / "out"), "--bundle",
                        str(tmp_path / "nothing")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"no bundle at {tmp_path / 'nothing'} (build it with scripts/gpu-bundle)" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_the_gpu_check_names_an_unknown_part(bundle, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts/gpu-check"), str(tmp_path / "out"), "--bundle", str(bundle),
                        "--only", "nvcc,tensorflow"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert ("gpu-check: no part tensorflow (the parts: host, remoting, driver-api, twins, nvcc, corpus, pytorch, "
            "cuda-core, cupy, numba)") in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
