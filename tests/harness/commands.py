"""Set-up commands a person runs (pip, venv, jupyter), run as the tests need them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

#: What pip prints when it cannot reach the package index.
OFFLINE = ("NewConnectionError", "Failed to establish a new connection",
           "Temporary failure in name resolution", "No matching distribution found")


def run_setup(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
              timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    """Run a set-up command as a person would; an index that cannot be reached skips the
    test (it fails under CI=true, which has the index); any other failure fails it."""
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        output = done.stdout + done.stderr
        if os.environ.get("CI") != "true" and any(s in output for s in OFFLINE):
            pytest.skip(f"the package index cannot be reached ({' '.join(args[:4])}): "
                        f"{output.strip().splitlines()[-1]}")
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{output[-4000:]}")
    return done
