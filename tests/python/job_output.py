# SPDX-License-Identifier: Apache-2.0
"""Helpers for tests that watch a background job through its output file."""
import pathlib
import time

import pytest


def wait_for(predicate, timeout, what):
    """Polls `predicate` until it is true; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def lines(path: pathlib.Path):
    """The lines a job has written so far (none if the file does not exist yet)."""
    return path.read_text().splitlines() if path.exists() else []
