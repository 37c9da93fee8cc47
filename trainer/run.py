"""The run behind the public training API :mod:`unicron.train` (whose docstring is the user's
guide): joining the job's group, the step loop, the exception hook and the exit."""

from __future__ import annotations

import atexit
import sys
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import torch
from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.workerchannel import WorkerEnv, WorkerLaunch
from unicron.trainer.exits import exit_now
from unicron.trainer.runtime import Runtime, RuntimeOptions
from unicron.trainer.sampling import MapDataset, Source, source_of

__all__ = ["Run", "init"]

_current: Run | None = None


class Run:
    """One rank of a job as a training script sees it; made by :func:`init`."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.closed = False

    @property
    def spec(self) -> JobSpec:
        return self._runtime.launch.spec

    @property
    def device(self) -> torch.device:
        return self._runtime.device

    @property
    def rank(self) -> int:
        """This rank in the current generation (it may change when the group is re-formed)."""
        elastic = self._runtime.rank
        return (elastic.launch if elastic is not None else self._runtime.launch).rank

    @property
    def world_size(self) -> int:
        elastic = self._runtime.rank
        return (elastic.launch if elastic is not None else self._runtime.launch).world_size

    @property
    def step(self) -> int | None:
        """The step being trained (1-based), None before the first batch."""
        elastic = self._runtime.rank
        return elastic.step if elastic is not None else None

    def wrap(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
    ) -> None:
        """Train ``model`` with ``optimizer`` (and a learning-rate ``scheduler``, stepped once
        per step). Their state now is the job's start; it is replaced by the newest
        checkpoint's, or for a joiner by a live peer's, so every rank holds the same."""
        self._runtime.start(model.to(self.device), optimizer, scheduler)

    def batches(self, data: MapDataset | Source) -> Iterator[Any]:
        """This rank's micro-batches of every remaining step; call :meth:`backward` with the
        mean loss of each before asking for the next. ``data`` is a map-style dataset or a
        callable ``source(step, index) -> batch`` (a pure function of its arguments)."""
        elastic = self._runtime.rank
        if elastic is None:
            raise RuntimeError("call run.wrap(model, optimizer) before run.batches()")
        fetch = source_of(data, self.spec, self.device)
        try:
            yield from elastic.batches(fetch)
        except Exception as exc:
            self._runtime.report(exc)  # now, while the agent can still be told
            raise

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate one micro-batch's mean ``loss`` and count it into the step."""
        elastic = self._runtime.rank
        if elastic is None:
            raise RuntimeError("call run.wrap(model, optimizer) before run.backward()")
        elastic.backward(loss)

    def fail(self, exc: BaseException) -> bool:
        """Report ``exc`` as what ends this rank (once; a repeat or a wrapper is not sent);
        True when its traceback is already on stderr."""
        return self._runtime.report(exc)

    def close(self, failed: bool = False) -> None:
        """Flush the last reports and leave the group; at exit this happens by itself."""
        global _current
        if self.closed:
            return
        self.closed = True
        if _current is self:
            _current = None
        self._runtime.close(failed)

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, Exception):
            self.fail(exc)
        self.close(failed=exc is not None)


def init(
    launch: WorkerLaunch | None = None,
    *,
    spec: JobSpec | None = None,
    options: RuntimeOptions | None = None,
) -> Run:
    """This process's rank of its job: from ``launch`` (a ``WorkerLaunch``), else from
    ``UNICRON_WORKER_LAUNCH``, else a local single-process run of ``spec`` (default
    ``JobSpec``). Raises ValueError for a launch that is not valid."""
    global _current
    if launch is None:
        launch = WorkerEnv.read().launch
    runtime = Runtime(launch, options, spec)
    torch.manual_seed(runtime.launch.spec.seed)  # the same initial model on every rank
    run = _current = Run(runtime)
    _install_hooks()
    return run


_previous_hook = sys.excepthook


def _excepthook(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    """Report an uncaught exception of the current run, then leave with exit code 1 without
    interpreter teardown, which can hang on a broken process group."""
    run = _current
    if run is None or run.closed:
        _previous_hook(exc_type, exc, tb)
        return
    if not (isinstance(exc, Exception) and run.fail(exc)):
        _previous_hook(exc_type, exc, tb)
    run.close(failed=True)
    exit_now(1)


def _at_exit() -> None:
    if _current is not None:
        _current.close()


def _install_hooks() -> None:
    if sys.excepthook is not _excepthook:
        sys.excepthook = _excepthook
        atexit.register(_at_exit)
