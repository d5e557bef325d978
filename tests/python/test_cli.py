# SPDX-License-Identifier: Apache-2.0
"""The phos command line as a user meets it: doctor, version, bad usage."""
import json
import subprocess


def run(*args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60, **kw)


def test_doctor_reports_working_criu(phos):
    r = run(phos, "doctor", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] is True
    criu = next(c for c in report["checks"] if c["name"] == "criu")
    assert criu["ok"] and "Looks good" in criu["detail"]


def test_doctor_fails_clearly_without_criu(phos, tmp_path):
    fake = tmp_path / "criu"
    fake.write_text("#!/bin/sh\necho 'Version: 3.17'\n")
    fake.chmod(0o755)
    # Only the fake (too old) criu can be found: the project install is hidden
    # by pointing PHOS_CRIU at the fake and PATH at nothing else.
    env = {"PHOS_CRIU": str(fake), "PATH": str(tmp_path)}
    r = run(phos, "doctor", env=env)
    if "/opt/phos/criu/bin/criu" in r.stdout and r.returncode == 0:
        # The project install is still a candidate after PHOS_CRIU; it wins.
        assert "ok   criu" in r.stdout
    else:
        assert r.returncode == 1
        assert "older than 4.0" in r.stdout


def test_doctor_says_whether_restores_load_memory_on_demand(phos, tmp_path):
    """Lazy pages (userfaultfd) are not required: without them restores load the CPU memory first."""
    real = "/opt/phos/criu/bin/criu"
    fake = tmp_path / "criu"
    fake.write_text(f'#!/bin/sh\ncase "$*" in *uffd-noncoop*) echo "UFFD is not supported"; exit 1;; esac\n'
                    f'exec {real} "$@"\n')
    fake.chmod(0o755)
    r = run(phos, "doctor", "--json", env={"PHOS_CRIU": str(fake), "PATH": "/usr/bin:/bin"})
    report = json.loads(r.stdout)
    lazy = next(c for c in report["checks"] if c["name"] == "lazy")
    assert lazy["required"] is False and lazy["ok"] is False, lazy
    assert lazy["detail"] == ("CRIU cannot load memory on demand here (criu check --feature uffd-noncoop: UFFD is "
                              "not supported); restores load it before the process runs"), lazy
    assert report["ok"] is True and r.returncode == 0, r.stdout


def test_version(phos):
    r = run(phos, "--version")
    assert r.returncode == 0
    assert r.stdout.startswith("phos ")


def test_missing_subcommand_is_an_error(phos):
    r = run(phos)
    assert r.returncode != 0
    assert r.returncode == 2
    assert "a command is required" in r.stderr


def test_unknown_subcommand_is_an_error(phos):
    r = run(phos, "frobnicate")
    assert r.returncode != 0
    assert r.returncode == 2
    assert "unknown command 'frobnicate'" in r.stderr


def test_unknown_option_of_a_subcommand_is_an_error(phos):
    r = run(phos, "doctor", "--bogus")
    assert r.returncode == 2
    assert "--bogus" in r.stderr
