"""``unicron submit --working-dir DIR``: pack DIR as a tar.gz to upload as the job's package.

Everything is checked before anything is sent, so a refused directory submits nothing: it must
be a readable directory of at most ``MAX_PACKAGE_BYTES`` (counted before compression, and the
archive too), and when the entrypoint runs a script by a relative path (``python train.py``,
``bash run.sh``, ``./run.sh``) that script must be in DIR. ``.git`` and ``__pycache__`` are
left out: they are never needed to run and can be large.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from collections.abc import Sequence
from pathlib import Path

from unicron.cli.common import EXIT_REFUSED, fail
from unicron.shared.bus.packages import MAX_PACKAGE_BYTES

SKIPPED = frozenset({".git", "__pycache__"})
_INTERPRETER = re.compile(r"^(python[0-9.]*|sh|bash)$")


def script_of(argv: Sequence[str]) -> str | None:
    """The script path the entrypoint runs, when it can tell (None for ``python -m mod``)."""
    if not argv:
        return None
    if _INTERPRETER.match(Path(argv[0]).name):
        for arg in argv[1:]:
            if arg in ("-m", "-c"):
                return None
            if not arg.startswith("-"):
                return arg
        return None
    return argv[0] if "/" in argv[0] else None


def require_dir(directory: Path) -> None:
    if not directory.is_dir():
        fail(f"working dir {directory} is not a directory", EXIT_REFUSED)
    if not os.access(directory, os.R_OK | os.X_OK):
        fail(f"cannot read working dir {directory}: permission denied", EXIT_REFUSED)


def check_script(argv: Sequence[str], directory: Path) -> None:
    """Refuse an entrypoint whose script, by a relative path, is not in DIR."""
    require_dir(directory)
    script = script_of(argv)
    if script is None or os.path.isabs(script):
        return
    if not (directory / script).is_file():
        fail(f"entrypoint runs {script!r}, which is not a file in {directory}", EXIT_REFUSED)


def _size(directory: Path, limit: int) -> int:
    """Bytes of the files to pack; stops counting once past ``limit``."""
    total = 0

    def refuse(exc: OSError) -> None:
        fail(f"cannot read working dir {directory}: {exc}", EXIT_REFUSED)

    for root, dirs, files in os.walk(directory, onerror=refuse):
        dirs[:] = [d for d in dirs if d not in SKIPPED]
        for name in files:
            path = Path(root) / name
            try:
                total += path.lstat().st_size if not path.is_symlink() else 0
            except OSError as exc:
                refuse(exc)
            if total > limit:
                return total
    return total


def pack(directory: Path, limit: int = MAX_PACKAGE_BYTES) -> bytes:
    """DIR as a tar.gz; exits 2 with a clear message when it cannot or may not be packed."""
    require_dir(directory)
    mib = limit / (1024 * 1024)
    if _size(directory, limit) > limit:
        why = f"packages are limited to {mib:g} MiB (leave data out, or use a path every node sees)"
        fail(f"working dir {directory} holds more than {mib:g} MiB; {why}", EXIT_REFUSED)
    buffer = io.BytesIO()

    def skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if Path(info.name).name in SKIPPED else info

    try:
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for entry in sorted(directory.iterdir()):
                tar.add(entry, arcname=entry.name, filter=skip)
    except OSError as exc:
        fail(f"cannot read working dir {directory}: {exc}", EXIT_REFUSED)
    data = buffer.getvalue()
    if len(data) > limit:
        fail(f"package of {directory} is over {mib:g} MiB", EXIT_REFUSED)
    return data
