"""A child's entry point: ``python -m bench.gpuprobe.worker --child ROLE --cfg JSON`` runs one
role (the orchestrator starts every child so, from the repository root). Each role writes its
events on stdout and ends the process itself."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from bench.gpuprobe.basics import role_versions
from bench.gpuprobe.common import Record
from bench.gpuprobe.member import role_member
from bench.gpuprobe.nonblocking import role_nonblocking
from bench.gpuprobe.nvml import role_nvml
from bench.gpuprobe.oom_step import role_oom, role_step
from bench.gpuprobe.regroup import role_joiner, role_spare

ROLES: dict[str, Callable[[Record], None]] = {
    "member": role_member,
    "joiner": role_joiner,
    "spare": role_spare,
    "nonblocking": role_nonblocking,
    "oom": role_oom,
    "nvml": role_nvml,
    "step": role_step,
    "versions": role_versions,
}


def run_role(role: str, cfg: str) -> None:
    """Run the role named ``role`` with its settings (``cfg``, a JSON object)."""
    ROLES[role](json.loads(cfg))


def main() -> None:
    parser = argparse.ArgumentParser(description="one child role of the GPU probe")
    parser.add_argument("--child", required=True, choices=sorted(ROLES))
    parser.add_argument("--cfg", default="{}", help="the role's settings, a JSON object")
    args = parser.parse_args()
    run_role(args.child, args.cfg)


if __name__ == "__main__":
    main()
