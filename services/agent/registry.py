"""The trainer entrypoints this agent may run.

A ``StartWorker`` command names a trainer (``JobSpec.trainer``, e.g. "gpt"); the agent looks it
up here and runs ``[sys.executable, "-m", module]``. Only code registered in the project or in
this node's own settings can ever run: nothing from the bus becomes part of a command line.
"""

from __future__ import annotations

import re
import sys

DEFAULT_ENTRYPOINTS: dict[str, str] = {"gpt": "unicron.trainer.worker"}

# A dotted python module path, so a registered value can never smuggle in an argument or flag.
MODULE_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
_MODULE = re.compile(MODULE_PATH)


class UnknownTrainerError(LookupError):
    """The command names a trainer that is not registered on this node."""


class EntrypointRegistry:
    def __init__(self, entries: dict[str, str] | None = None) -> None:
        self._entries: dict[str, str] = {}
        for name, module in (entries or {}).items():
            self.register(name, module)

    def register(self, trainer: str, module: str) -> None:
        """Map ``trainer`` to ``module`` (replacing any earlier entry for that name)."""
        if not _MODULE.match(module):
            raise ValueError(f"not a python module path: {module!r}")
        self._entries[trainer] = module

    def module(self, trainer: str) -> str:
        try:
            return self._entries[trainer]
        except KeyError:
            raise UnknownTrainerError(f"trainer {trainer!r} is not registered") from None

    def argv(self, trainer: str) -> list[str]:
        """The worker's command line: the agent's own interpreter running the module."""
        return [sys.executable, "-m", self.module(trainer)]

    def names(self) -> list[str]:
        return sorted(self._entries)


REGISTRY = EntrypointRegistry(DEFAULT_ENTRYPOINTS)


def register(trainer: str, module: str) -> None:
    """Register an entrypoint in the process-wide default registry."""
    REGISTRY.register(trainer, module)


def build_registry(extra: dict[str, str]) -> EntrypointRegistry:
    """The default registry's entries plus this node's own (which win on a clash)."""
    registry = EntrypointRegistry({name: REGISTRY.module(name) for name in REGISTRY.names()})
    for name, module in extra.items():
        registry.register(name, module)
    return registry
