"""The public package: every name it lists resolves, and importing it costs a process nothing
it does not use (every service, agent and worker imports ``unicron`` first)."""

from __future__ import annotations

import subprocess
import sys

import unicron


def test_every_public_name_resolves() -> None:
    missing = [name for name in unicron.__all__ if getattr(unicron, name, None) is None]
    assert missing == []


def test_importing_the_package_does_not_load_the_client() -> None:
    probe = "import sys, unicron; print(sorted({'httpx', 'unicron.client'} & set(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"
