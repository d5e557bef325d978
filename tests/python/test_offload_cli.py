# SPDX-License-Identifier: Apache-2.0
"""`phos offload-plan` as a user meets it: plans, blocking times, and every input mistake."""
import json
import subprocess

import pytest


def run(*args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60, **kw)


# The paper's Figure 1 example on the DGX-1 cube-mesh, in the paper's units
# (1 MB = 1e6 bytes): G0 has 480 MB and G6 240 MB left over, G4 can take
# 480 MB and G1 160 MB.
DGX1_LINKS = [(0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2), (1, 2, 2), (1, 3, 1), (1, 5, 2),
              (2, 3, 2), (2, 6, 1), (3, 7, 1), (4, 5, 1), (4, 6, 1), (4, 7, 2), (5, 6, 2),
              (5, 7, 1), (6, 7, 2)]


def figure1():
    gpus = [{"checkpoint_bytes": 0, "free_bytes": 0} for _ in range(8)]
    gpus[0]["checkpoint_bytes"] = 480_000_000
    gpus[6]["checkpoint_bytes"] = 240_000_000
    gpus[4]["free_bytes"] = 480_000_000
    gpus[1]["free_bytes"] = 160_000_000
    return {
        "chunk_bytes": 1_000_000,
        "host_bandwidth": 12e9,
        "gpus": gpus,
        "links": [{"a": a, "b": b, "bandwidth": n * 24e9} for a, b, n in DGX1_LINKS],
    }


def write(tmp_path, instance, name="instance.json"):
    path = tmp_path / name
    path.write_text(instance if isinstance(instance, str) else json.dumps(instance))
    return path


def test_json_output_has_every_scheduler_with_the_papers_times(phos, tmp_path):
    r = run(phos, "offload-plan", write(tmp_path, figure1()), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"baseline", "greedy", "flow", "exact"}
    assert out["baseline"]["blocking_seconds"] == pytest.approx(0.040)
    assert out["greedy"]["blocking_seconds"] == pytest.approx(0.020)
    assert out["flow"]["blocking_seconds"] == pytest.approx(0.24 / 36)
    assert out["exact"]["blocking_seconds"] == pytest.approx(0.24 / 36)
    assert out["greedy"]["transfers"] == [
        {"from": 0, "to": 4, "bytes": 480_000_000},
        {"from": 6, "to": "host", "bytes": 240_000_000},
    ]
    for name in out:
        moved = {}
        for t in out[name]["transfers"]:
            moved[t["from"]] = moved.get(t["from"], 0) + t["bytes"]
        assert moved == {0: 480_000_000, 6: 240_000_000}, name


def test_one_scheduler_in_text(phos, tmp_path):
    r = run(phos, "offload-plan", write(tmp_path, figure1()), "--scheduler", "greedy")
    assert r.returncode == 0, r.stderr
    assert "8 GPUs, 2 sender(s), 720 chunk(s) of 1000000 bytes" in r.stdout
    assert "greedy: blocking 20.000000 ms, 2 transfer(s)" in r.stdout
    assert "GPU 0   -> GPU 4        480 chunks      480000000 bytes" in r.stdout
    assert "GPU 6   -> host         240 chunks      240000000 bytes" in r.stdout
    assert "baseline" not in r.stdout


def test_one_scheduler_in_json(phos, tmp_path):
    r = run(phos, "offload-plan", write(tmp_path, figure1()), "--scheduler", "exact", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert list(out) == ["exact"]
    assert out["exact"]["blocking_seconds"] == pytest.approx(0.24 / 36)


def test_egress_limit_is_honoured(phos, tmp_path):
    inst = {
        "chunk_bytes": 1, "host_bandwidth": 2,
        "gpus": [{"checkpoint_bytes": 12, "free_bytes": 0, "egress_limit": 10},
                 {"checkpoint_bytes": 0, "free_bytes": 100},
                 {"checkpoint_bytes": 0, "free_bytes": 100}],
        "links": [{"a": 0, "b": 1, "bandwidth": 10}, {"a": 0, "b": 2, "bandwidth": 10}],
    }
    out = json.loads(run(phos, "offload-plan", write(tmp_path, inst), "--json").stdout)
    assert out["exact"]["blocking_seconds"] == pytest.approx(1.0)
    assert out["greedy"]["blocking_seconds"] == pytest.approx(1.2)


BAD_INPUTS = [
    ("{", "malformed JSON"),
    ('{"chunk_bytes": 4, "gpus": []}', "missing field 'host_bandwidth'"),
    ('{"chunk_bytes": 4, "host_bandwidth": 1, "gpus": []}', "gpus is empty"),
    ('{"chunk_bytes": 4, "host_bandwidth": 1, "gpus": [{"checkpoint_bytes": -1, "free_bytes": 0}]}',
     "gpus[0].checkpoint_bytes is negative (-1)"),
    ('{"chunk_bytes": 4, "host_bandwidth": 1, "gpus": [{"checkpoint_bytes": 1, "free_bytes": -2}]}',
     "gpus[0].free_bytes is negative (-2)"),
    ('{"chunk_bytes": 4, "host_bandwidth": 1, "gpus": [{"checkpoint_bytes": 1, "free_bytes": 0}],'
     ' "links": [{"a": 0, "b": 3, "bandwidth": 1e9}]}',
     "links[0] names GPU 3, but there are only 1 GPUs (0..0)"),
    ('{"chunk_bytes": 4, "host_bandwidth": 1, "gpus": [{"checkpoint_bytes": 1, "free_bytes": 0},'
     ' {"checkpoint_bytes": 1, "free_bytes": 0}], "links": [{"a": 0, "b": 1, "bandwidth": 0}]}',
     "links[0].bandwidth must be at least 1 byte/s"),
    ('{"chunk_bytes": 0, "host_bandwidth": 1, "gpus": [{"checkpoint_bytes": 1, "free_bytes": 0}]}',
     "chunk_bytes must be positive"),
    ('{"chunk_bytes": 4, "host_bandwidth": -1, "gpus": [{"checkpoint_bytes": 1, "free_bytes": 0}]}',
     "host_bandwidth must be at least 1 byte/s"),
    ('{"chunk_bytes": 4, "host_bandwidth": 1, "gpus": [{"checkpoint_bytes": 1, "free_bytes": 0,'
     ' "egres_limit": 5}]}', "unknown field 'gpus[0].egres_limit'"),
    ('{"chunk_bytes": 1, "host_bandwidth": 1, "gpus": [{"checkpoint_bytes": 1e12, "free_bytes": 0}]}',
     "use a larger chunk_bytes"),
]


@pytest.mark.parametrize("text,message", BAD_INPUTS)
def test_bad_instance_is_named_with_exit_2(phos, tmp_path, text, message):
    path = write(tmp_path, text)
    r = run(phos, "offload-plan", path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    assert str(path) in r.stderr
    assert r.stdout == ""


def test_missing_file(phos, tmp_path):
    r = run(phos, "offload-plan", tmp_path / "nope.json")
    assert r.returncode == 2
    assert "cannot read" in r.stderr and "nope.json" in r.stderr
    assert "No such file or directory" in r.stderr


def test_directory_instead_of_file(phos, tmp_path):
    r = run(phos, "offload-plan", tmp_path)
    assert r.returncode == 2
    assert "it is a directory" in r.stderr


def test_unknown_scheduler(phos, tmp_path):
    r = run(phos, "offload-plan", write(tmp_path, figure1()), "--scheduler", "fastest")
    assert r.returncode == 2
    assert "fastest" in r.stderr and "--scheduler" in r.stderr


def test_missing_instance_argument(phos):
    r = run(phos, "offload-plan")
    assert r.returncode == 2
    assert "instance" in r.stderr and "required" in r.stderr


# phos-offload-sim: the trace generator and replay simulator.

@pytest.fixture(scope="session")
def offload_sim(build_dir):
    exe = build_dir / "offload" / "phos-offload-sim"
    assert exe.exists(), f"{exe} was not built"
    return exe


def test_simulator_generates_and_replays_a_trace(offload_sim, tmp_path):
    trace = tmp_path / "trace.csv"
    r = run(offload_sim, "generate", "--kind", "stationary", "--snapshots", "30", "--seed", "4",
            "--out", trace)
    assert r.returncode == 0, r.stderr
    lines = trace.read_text().splitlines()
    assert lines[0] == "snapshot,gpu,bytes" and len(lines) == 1 + 30 * 8
    records = tmp_path / "records.csv"
    r = run(offload_sim, "run", "--trace", trace, "--topology", "dgx1", "--free-mib", "80,160",
            "--records", records)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["topology"] == "dgx1"
    assert [s["free_bytes"] for s in out["settings"]] == [80 << 20, 160 << 20]
    for setting in out["settings"]:
        sched = setting["schedulers"]
        assert sched["flow"]["max_ratio_to_exact"] == pytest.approx(1.0)
        assert sched["exact"]["mean_blocking_seconds"] <= sched["greedy"]["mean_blocking_seconds"]
        assert sched["greedy"]["mean_blocking_seconds"] <= sched["baseline"]["mean_blocking_seconds"]
        assert sched["baseline"]["mean_ratio_to_exact"] > 1.5
    assert len(records.read_text().splitlines()) == 1 + 30 * 2 * 4


SIM_ERRORS = [
    (["run"], "run needs --trace FILE"),
    (["run", "--trace", "{missing}"], "No such file or directory"),
    (["run", "--trace", "{bad}"], "trace line 2: expected 'snapshot,gpu,bytes', got '0,1'"),
    (["run", "--trace", "{good}", "--topology", "torus"], "unknown topology 'torus'"),
    (["run", "--trace", "{good}", "--topology", "nvswitch:4"], "names GPU 4, the topology has 4"),
    (["run", "--trace", "{good}", "--free-mib", "80,x"], "--free-mib must be a non-negative"),
    (["run", "--trace", "{good}", "--chunk-bytes", "0"], "chunk_bytes must be positive"),
    (["run", "--trace", "{good}", "--bogus", "1"], "unknown option '--bogus'"),
    (["run", "--trace", "{good}", "--records", "/nonexistent/dir/r.csv"], "cannot write"),
    (["generate", "--kind", "zigzag"], "--kind is ramp or stationary, not 'zigzag'"),
    (["generate", "--gpus", "0"], "--gpus must be 1..100000"),
    (["generate", "--snapshots", "100000", "--gpus", "1000"], "more than 10 million"),
    (["frobnicate"], "usage: phos-offload-sim"),
]


@pytest.mark.parametrize("args,message", SIM_ERRORS)
def test_simulator_errors_are_named_with_exit_2(offload_sim, tmp_path, args, message):
    good = tmp_path / "good.csv"
    good.write_text("".join(f"0,{g},{g * 1000}\n" for g in range(8)))
    bad = tmp_path / "bad.csv"
    bad.write_text("0,0,1\n0,1\n")
    paths = {"missing": tmp_path / "missing.csv", "bad": bad, "good": good}
    r = run(offload_sim, *[a.format(**paths) for a in args])
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
