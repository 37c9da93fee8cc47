"""Checkpoints of the full training state on one node's disk, written atomically.

A checkpoint is ``<dir>/step-<n>.pt`` holding the model, the optimizer (and the learning-rate
scheduler, when the run has one) and the step. ``<dir>`` is the node's own (under the agent's
``UNICRON_DATA_DIR``), never shared: every node keeps its own copy (:mod:`unicron.trainer.storage`
decides who writes it). A file is written to a temporary name in the same directory and
renamed into place, so a reader never sees half a file even if the writer dies mid-way. Only
the newest few are kept.

Of the ranks on one node, the first to :func:`claim` a step writes it: an exclusive create of
a marker ``.step-<n>.g<generation>.claim`` next to the checkpoint, so two ranks never both
write and no rank needs to know who else shares its node.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from unicron.trainer.parallel import Scheduler

KEEP_LAST = 3

_NAME = re.compile(r"^step-(\d+)\.pt$")
# Everything else a step leaves in the directory: claim markers and temporary files.
_HIDDEN = re.compile(r"^\.step-(\d+)\.")
_CLAIM = re.compile(r"^\.step-(\d+)\.g\d+\.claim$")

TrainState = dict[str, Any]


def checkpoint_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step-{step}.pt"


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every complete checkpoint in ``directory``, oldest first."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), root / m.group(0)) for m in map(_NAME.match, os.listdir(root)) if m]
    return sorted(found)


def claim(directory: str | Path, step: int, generation: int) -> bool:
    """Whether this process is the first on this node to claim writing ``step`` in
    ``generation`` (a step re-run by a later generation is claimed afresh)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    marker = root / f".step-{step}.g{generation}.claim"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def drop_unfinished_claims(directory: str | Path) -> None:
    """Remove the claims of steps newer than the newest checkpoint: their writer died, and a
    rerun under the same generation (a local run) must be able to write them."""
    root = Path(directory)
    if not root.is_dir():
        return
    found = list_checkpoints(root)
    newest = found[-1][0] if found else 0
    for name in os.listdir(root):
        match = _CLAIM.match(name)
        if match and int(match.group(1)) > newest:
            (root / name).unlink(missing_ok=True)


def save(directory: str | Path, step: int, state: TrainState, keep_last: int = KEEP_LAST) -> Path:
    """Write ``state`` as the checkpoint of ``step`` and prune all but the newest ``keep_last``."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(root, step)
    fd, tmp_name = tempfile.mkstemp(prefix=f".step-{step}.", suffix=".tmp", dir=root)
    try:
        with os.fdopen(fd, "wb") as tmp:
            torch.save(state, tmp)
            tmp.flush()
            # Without fsync a power loss after the rename could leave an empty "complete" file.
            os.fsync(tmp.fileno())
        os.replace(tmp_name, final)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _prune(root, keep_last)
    return final


def _prune(root: Path, keep_last: int) -> None:
    found = list_checkpoints(root)
    for _, path in found[:-keep_last]:
        path.unlink(missing_ok=True)
    oldest_kept = found[-keep_last:][0][0] if found else 0
    # Claims and temporaries of pruned steps (and of steps no one finished) go with them.
    for name in os.listdir(root):
        match = _HIDDEN.match(name)
        if match and int(match.group(1)) < oldest_kept:
            (root / name).unlink(missing_ok=True)


def load_latest(directory: str | Path) -> tuple[int, TrainState] | None:
    """The newest readable checkpoint as ``(step, state)``, or None when there is none.

    A file that cannot be read (e.g. truncated by a full disk) is skipped in favour of the
    next older one: resuming from a little earlier beats not resuming at all.
    """
    for step, path in reversed(list_checkpoints(directory)):
        state = load(path, step)
        if state is not None:
            return step, state
    return None


def load(path: str | Path, step: int) -> TrainState | None:
    """The state in ``path`` if it is a readable checkpoint of ``step``, else None."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return None
    if isinstance(state, dict) and state.get("step") == step:
        return state
    return None


def capture(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    scheduler: Scheduler | None = None,
) -> TrainState:
    """Everything a run needs to continue exactly after ``step``, with tensors on the CPU.

    The data order is a function of the step, so the model, the optimizer, the scheduler and
    the step are the whole state (a model with randomness of its own must derive it from the
    step, or resuming repeats no draw exactly).
    """
    state: TrainState = {
        "step": step,
        "model": _to_cpu(model.state_dict()),
        "optimizer": _to_cpu(optimizer.state_dict()),
    }
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    return state


def restore(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    scheduler: Scheduler | None = None,
) -> int:
    """Load ``state`` into ``model``, ``optimizer`` (and ``scheduler``); returns the step it
    was taken after."""
    model.load_state_dict(state["model"])
    # Optimizers move their state tensors onto each parameter's device as they load them.
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and "scheduler" in state:
        scheduler.load_state_dict(state["scheduler"])
    return int(state["step"])


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(item) for item in value)
    return value
