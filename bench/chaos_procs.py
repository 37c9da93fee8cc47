"""Orphaned workers of a chaos run, found in ``/proc``.

Every process a stack's agents start inherits the stack's ``UNICRON_DATA_DIR``; a worker also
carries ``UNICRON_JOB_ID`` (or, as a warm spare that took a launch, appears as a worker pid in
a job record). Matching on the data directory keeps other stacks on the same machine (other
tests, other benchmarks) out of the count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DATA_DIR_ENV = "UNICRON_DATA_DIR"
JOB_ENV = "UNICRON_JOB_ID"


@dataclass(frozen=True)
class StackProcess:
    pid: int
    cmdline: str
    job_id: str | None  # from its environment: a worker started for a job
    spare: bool  # started as a warm spare (it may have become a worker since)

    def describe(self) -> str:
        what = self.job_id or ("spare" if self.spare else "process")
        return f"pid {self.pid} ({what}): {self.cmdline[:120]}"


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # gone meanwhile, or not ours to read
        return None


def _running(proc: Path) -> bool:
    stat = _read(proc / "stat")
    # A zombie (Z) or dead (X) process is exited; its parent just has not reaped it yet.
    return stat is not None and stat.rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")


def stack_processes(data_dir: Path, exclude: set[int]) -> list[StackProcess]:
    """Live processes started by the stack of ``data_dir``, but not ``exclude`` (its services
    and agents)."""
    wanted = f"{DATA_DIR_ENV}={data_dir}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in exclude:
            continue
        environ = _read(proc / "environ")
        if not environ or wanted not in environ.split(b"\0") or not _running(proc):
            continue
        env = dict(
            item.decode(errors="replace").split("=", 1)
            for item in environ.split(b"\0")
            if b"=" in item
        )
        cmdline = (_read(proc / "cmdline") or b"").replace(b"\0", b" ").decode(errors="replace")
        spare = "--spare" in cmdline.split() or env.get("UNICRON_WORKER_SPARE") == "1"
        found.append(StackProcess(int(proc.name), cmdline.strip(), env.get(JOB_ENV), spare))
    return found


def orphan_workers(
    processes: list[StackProcess], ever_workers: set[int], assigned: set[int]
) -> list[StackProcess]:
    """Workers that no job's current assignment names: a process started for a job, or one a
    job record once named as its worker, that is not among ``assigned`` (the live workers of
    jobs still running). A spare that never served a job is the agent's, not an orphan."""
    return [
        p
        for p in processes
        if (p.job_id is not None or p.pid in ever_workers) and p.pid not in assigned
    ]
