# SPDX-License-Identifier: Apache-2.0
"""`phos policy INPUT.json` as a user meets it: the worked example of docs/policy.md,
and one test per way the input can be wrong (message names the problem, exit 2)."""
import copy
import json
import math
import subprocess

import pytest

# docs/policy.md, "Worked example".
EXAMPLE = {
    "gpus": 2,
    "failures_per_gpu_hour": 1,
    "checkpoint_overhead_seconds": 36,
    "restore_seconds": 180,
    "levels": [
        {"name": "host-dram", "checkpoint_seconds": 2, "restore_seconds": 10,
         "failures_per_hour": 2},
        {"name": "local-disk", "checkpoint_seconds": 20, "restore_seconds": 60,
         "failures_per_hour": 0.5},
    ],
}


def run(*args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60)


def policy(phos, tmp_path, document):
    path = tmp_path / "input.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return run(phos, "policy", path)


def test_worked_example(phos, tmp_path):
    r = policy(phos, tmp_path, EXAMPLE)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # f* = sqrt(N F / (2 O)) = sqrt(2 * 1 / (2 * 0.01 h)) = 10 per hour.
    assert out["checkpoints_per_hour"] == pytest.approx(10.0, rel=1e-12)
    assert out["interval_seconds"] == pytest.approx(360.0, rel=1e-12)
    # N F (R + 1/(2f)) + O f = 2 (0.05 + 0.05) + 0.01 * 10 = 0.3.
    assert out["wasted_fraction"] == pytest.approx(0.3, rel=1e-12)
    dram, disk = out["levels"]
    assert (dram["name"], dram["every"]) == ("host-dram", 1)
    assert (disk["name"], disk["every"]) == ("local-disk", 6)
    # tau = sqrt(2 (2 + 20/6) / (w (2 + 6 * 0.5) / 3600)) = sqrt(7680 / w) with w = 1.149668.
    w = 1.149668
    assert dram["interval_seconds"] == pytest.approx(math.sqrt(7680 / w), rel=1e-5)
    assert dram["interval_seconds"] == pytest.approx(81.732, abs=1e-3)
    assert disk["interval_seconds"] == pytest.approx(6 * dram["interval_seconds"], rel=1e-12)
    assert out["levels_wasted_fraction"] == pytest.approx(1 - 1 / w, abs=1e-6)
    assert dram["continuous_interval_seconds"] == pytest.approx(80.684, abs=1e-3)
    assert disk["continuous_interval_seconds"] == pytest.approx(494.418, abs=1e-3)
    assert r.stderr == ""


def test_paper_figures(phos, tmp_path):
    # PhOS paper, section 8: 8 GPUs failing once per GPU-hour; Llama2-13B's
    # stall of 185 ms gives 279 checkpoints per hour, Singularity's 3.2 s gives 67.
    doc = copy.deepcopy(EXAMPLE)
    doc.update(gpus=8, failures_per_gpu_hour=1, checkpoint_overhead_seconds=0.185)
    r = policy(phos, tmp_path, doc)
    assert r.returncode == 0, r.stderr
    assert round(json.loads(r.stdout)["checkpoints_per_hour"]) == 279
    doc["checkpoint_overhead_seconds"] = 3.2
    r = policy(phos, tmp_path, doc)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["checkpoints_per_hour"] == pytest.approx(math.sqrt(4500), rel=1e-12)


def test_one_level(phos, tmp_path):
    # One level: the interval is Young's sqrt(2 C / lambda) shrunk by sqrt(w), and
    # nothing is promoted.
    doc = copy.deepcopy(EXAMPLE)
    doc["levels"] = [EXAMPLE["levels"][0]]
    r = policy(phos, tmp_path, doc)
    assert r.returncode == 0, r.stderr
    (level,) = json.loads(r.stdout)["levels"]
    assert level["every"] == 1
    assert level["interval_seconds"] < math.sqrt(2 * 2 * 3600 / 2)


def expect_bad_input(r, *fragments):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    for fragment in fragments:
        assert fragment in r.stderr, r.stderr


def test_missing_file(phos, tmp_path):
    r = run(phos, "policy", tmp_path / "nope.json")
    expect_bad_input(r, "cannot read", "nope.json")


def test_directory_instead_of_file(phos, tmp_path):
    expect_bad_input(run(phos, "policy", tmp_path), "cannot read")


def test_missing_argument(phos):
    expect_bad_input(run(phos, "policy"), "input")


def test_extra_argument(phos, tmp_path):
    path = tmp_path / "input.json"
    path.write_text(json.dumps(EXAMPLE))
    expect_bad_input(run(phos, "policy", path, "surplus"), "surplus")


@pytest.mark.parametrize("text, message", [
    ("", "malformed JSON"),
    ("{\"gpus\": 2,", "malformed JSON"),
    ("{\"gpus\": 2} trailing", "malformed JSON"),
    ("[1, 2]", "must be a JSON object, got array"),
    ("42", "must be a JSON object, got number"),
])
def test_not_a_json_object(phos, tmp_path, text, message):
    expect_bad_input(policy(phos, tmp_path, text), message)


def edited(edit):
    doc = copy.deepcopy(EXAMPLE)
    edit(doc)
    return doc


BAD_DOCUMENTS = {
    "gpus missing": (lambda d: d.pop("gpus"), "missing field 'gpus'"),
    "gpus zero": (lambda d: d.update(gpus=0), "gpus must be at least 1, got 0"),
    "gpus negative": (lambda d: d.update(gpus=-4), "gpus must be at least 1, got -4"),
    "gpus fractional": (lambda d: d.update(gpus=2.5), "'gpus' must be an integer, got 2.5"),
    "gpus string": (lambda d: d.update(gpus="2"), "'gpus' must be an integer, got string"),
    "gpus huge": (lambda d: d.update(gpus=2**40), "gpus must be at most"),
    "rate missing": (lambda d: d.pop("failures_per_gpu_hour"),
                     "missing field 'failures_per_gpu_hour'"),
    "rate zero": (lambda d: d.update(failures_per_gpu_hour=0),
                  "failures_per_gpu_hour must be a finite number > 0, got 0"),
    "rate negative": (lambda d: d.update(failures_per_gpu_hour=-1),
                      "failures_per_gpu_hour must be a finite number > 0, got -1"),
    "rate null": (lambda d: d.update(failures_per_gpu_hour=None),
                  "'failures_per_gpu_hour' must be a number, got null"),
    "overhead missing": (lambda d: d.pop("checkpoint_overhead_seconds"),
                         "missing field 'checkpoint_overhead_seconds'"),
    "overhead zero": (lambda d: d.update(checkpoint_overhead_seconds=0),
                      "checkpoint_overhead_seconds must be a finite number > 0"),
    "overhead negative": (lambda d: d.update(checkpoint_overhead_seconds=-0.5),
                          "checkpoint_overhead_seconds must be a finite number > 0"),
    "overhead string": (lambda d: d.update(checkpoint_overhead_seconds="36"),
                        "'checkpoint_overhead_seconds' must be a number, got string"),
    "overhead boolean": (lambda d: d.update(checkpoint_overhead_seconds=True),
                         "'checkpoint_overhead_seconds' must be a number, got boolean"),
    "restore missing": (lambda d: d.pop("restore_seconds"), "missing field 'restore_seconds'"),
    "restore negative": (lambda d: d.update(restore_seconds=-1),
                         "restore_seconds must be a finite number >= 0, got -1"),
    "restore array": (lambda d: d.update(restore_seconds=[1]),
                      "'restore_seconds' must be a number, got array"),
    "unknown field": (lambda d: d.update(gpu=2), "unknown field 'gpu'"),
    "levels missing": (lambda d: d.pop("levels"), "missing field 'levels'"),
    "levels object": (lambda d: d.update(levels={}), "'levels' must be an array, got object"),
    "zero levels": (lambda d: d.update(levels=[]), "levels must list at least one level"),
    "too many levels": (lambda d: d.update(levels=[
        dict(EXAMPLE["levels"][0], name=f"l{i}") for i in range(9)]), "at most 8"),
    "level not object": (lambda d: d["levels"].__setitem__(1, 3),
                         "levels[1]: must be an object, got number"),
    "level name missing": (lambda d: d["levels"][0].pop("name"),
                           "levels[0]: missing field 'name'"),
    "level name number": (lambda d: d["levels"][0].update(name=1),
                          "levels[0]: field 'name' must be a string, got number"),
    "level name empty": (lambda d: d["levels"][0].update(name=""),
                         "levels[0].name must not be empty"),
    "level name twice": (lambda d: d["levels"][1].update(name="host-dram"),
                         "levels[1].name \"host-dram\" is used twice"),
    "level cost missing": (lambda d: d["levels"][1].pop("checkpoint_seconds"),
                           "levels[1]: missing field 'checkpoint_seconds'"),
    "level cost zero": (lambda d: d["levels"][1].update(checkpoint_seconds=0),
                        "levels[1] (\"local-disk\").checkpoint_seconds must be a finite number > 0"),
    "level cost negative": (lambda d: d["levels"][1].update(checkpoint_seconds=-20),
                            "levels[1] (\"local-disk\").checkpoint_seconds"),
    "level cost string": (lambda d: d["levels"][1].update(checkpoint_seconds="20"),
                          "levels[1]: field 'checkpoint_seconds' must be a number, got string"),
    "level restore missing": (lambda d: d["levels"][0].pop("restore_seconds"),
                              "levels[0]: missing field 'restore_seconds'"),
    "level restore negative": (lambda d: d["levels"][0].update(restore_seconds=-1),
                               "levels[0] (\"host-dram\").restore_seconds must be a finite "
                               "number >= 0"),
    "level rate missing": (lambda d: d["levels"][0].pop("failures_per_hour"),
                           "levels[0]: missing field 'failures_per_hour'"),
    "level rate zero": (lambda d: d["levels"][0].update(failures_per_hour=0),
                        "levels[0] (\"host-dram\").failures_per_hour must be a finite number > 0"),
    "level rate negative": (lambda d: d["levels"][0].update(failures_per_hour=-2),
                            "levels[0] (\"host-dram\").failures_per_hour"),
    "level rate string": (lambda d: d["levels"][0].update(failures_per_hour="2"),
                          "levels[0]: field 'failures_per_hour' must be a number, got string"),
    "level unknown field": (lambda d: d["levels"][0].update(cost=1),
                            "levels[0]: unknown field 'cost'"),
}


@pytest.mark.parametrize("case", sorted(BAD_DOCUMENTS))
def test_bad_document(phos, tmp_path, case):
    edit, message = BAD_DOCUMENTS[case]
    expect_bad_input(policy(phos, tmp_path, edited(edit)), message)


def test_number_out_of_range(phos, tmp_path):
    text = json.dumps(EXAMPLE).replace('"restore_seconds": 180', '"restore_seconds": 1e400')
    r = policy(phos, tmp_path, text)
    assert r.returncode == 2
    assert "restore_seconds" in r.stderr or "1e400" in r.stderr, r.stderr


def test_no_steady_state_is_a_failure_with_a_reason(phos, tmp_path):
    # 64 GPUs failing twice an hour with a 10 minute restore: 128 failures an
    # hour, each costing 1/6 h of restore alone. Valid input, no useful answer.
    r = policy(phos, tmp_path, edited(lambda d: d.update(
        gpus=64, failures_per_gpu_hour=2, restore_seconds=600)))
    assert r.returncode == 1, r.stderr
    assert "too often" in r.stderr
    # A level whose failures outpace its recovery.
    r = policy(phos, tmp_path, edited(lambda d: d["levels"][0].update(
        failures_per_hour=60, restore_seconds=120)))
    assert r.returncode == 1, r.stderr
    assert "faster than the job can checkpoint and recover" in r.stderr
