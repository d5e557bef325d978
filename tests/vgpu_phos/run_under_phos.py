#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs one vgpu driver test executable through libphos.so against a phosd of its own.

usage: run_under_phos.py --phos PHOS --shim LIBPHOS [--daemon-env NAME=VALUE]... -- TEST [ARGS...]

A daemon per test executable: the vgpu tests assume a fresh driver per
process, and vgpu's state (devices, memory) lives in the daemon. PHOS_VGPU_*
settings therefore go to the daemon, not to the test. Exits with the test's
status; prints the daemon's log when the test fails.
"""
import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

START_TIMEOUT = 30
STOP_TIMEOUT = 10
# What the caller's environment must not leak into the daemon or the test:
# another daemon's directory, another preload, log settings that would make
# the shim write to the test's output.
SCRUBBED = ("LD_PRELOAD", "PHOS_RUNTIME_DIR", "PHOS_LOG", "PHOS_LOG_FILE", "PHOS_LOG_STDERR", "PHOS_DRIVER")


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phos", required=True, help="the phos executable")
    p.add_argument("--shim", required=True, help="libphos.so")
    p.add_argument("--daemon-env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of the daemon (vgpu runs there)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the test executable and its arguments")
    args = p.parse_args()
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("no test executable after --")
    # Absolute: the test's children may run elsewhere, and LD_PRELOAD must still name the shim.
    args.phos = os.path.abspath(args.phos)
    args.shim = os.path.abspath(args.shim)
    args.command[0] = os.path.abspath(args.command[0])
    return args


def base_env():
    env = dict(os.environ)
    for name in SCRUBBED:
        env.pop(name, None)
    return env


def wait_until_answering(phos, runtime_dir, daemon, env):
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            return False
        r = subprocess.run([phos, "ps", "--runtime-dir", runtime_dir], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=STOP_TIMEOUT)
        if r.returncode == 0:
            return True
        time.sleep(0.1)
    return False


def stop(phos, runtime_dir, daemon, env):
    if daemon.poll() is not None:
        return
    subprocess.run([phos, "daemon", "--stop", "--runtime-dir", runtime_dir], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=STOP_TIMEOUT)
    try:
        daemon.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


def main():
    args = parse()
    env = base_env()
    daemon_env = dict(env, PHOS_LOG=os.environ.get("PHOS_VGPU_PHOS_DAEMON_LOG", "daemon:info"))
    for item in args.daemon_env:
        name, _, value = item.partition("=")
        daemon_env[name] = value
    # Under /tmp: a socket path has at most 107 bytes.
    runtime_dir = tempfile.mkdtemp(prefix="phos-vgpu-", dir="/tmp")
    log_path = pathlib.Path(runtime_dir) / "phosd-foreground.log"
    status = 1
    daemon = None
    try:
        with open(log_path, "w") as log:
            daemon = subprocess.Popen([args.phos, "daemon", "--runtime-dir", runtime_dir, "--pool", "1"],
                                      env=daemon_env, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)
        if not wait_until_answering(args.phos, runtime_dir, daemon, env):
            print(f"run_under_phos: phosd did not answer in {runtime_dir} within {START_TIMEOUT}s", file=sys.stderr)
        else:
            test_env = dict(env, LD_PRELOAD=args.shim, PHOS_RUNTIME_DIR=runtime_dir)
            status = subprocess.run(args.command, env=test_env).returncode
    finally:
        if daemon is not None:
            stop(args.phos, runtime_dir, daemon, env)
        if status != 0:
            sys.stdout.flush()
            print(f"---- phosd log ({log_path}) ----", file=sys.stderr)
            print(log_path.read_text() if log_path.exists() else "(none)", file=sys.stderr)
        shutil.rmtree(runtime_dir, ignore_errors=True)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
