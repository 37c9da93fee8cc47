"""Cluster and job descriptions: JSON files in, validated frozen values out.

``--cluster`` is one object: ``{"nodes": 16, "gpus_per_node": 8, "gpu": "A100"}`` (``gpu`` names
a planner preset of :mod:`unicron.planning.clusters`, case-insensitive). ``--jobs`` is a list of
objects with ``name``, ``params_b``, ``weight``, ``min_gpus``, ``max_gpus`` and, optionally,
``arrival_s`` (default 0), ``length_s`` (the job's work, as seconds of failure-free running on
``max_gpus``; default: runs to the end) and ``checkpoint_interval_s`` (default 1800, the
paper's 15 min of recomputation being half an interval). Every error names the file, the line
and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from unicron.planning.api import Calibration
from unicron.planning.calibration import calibration_of
from unicron.planning.clusters import CLUSTERS
from unicron.planning.spec import ClusterSpec
from unicron.shared.contracts.calibration import CalibrationRecord


class InputError(ValueError):
    """A bad input file: says which file, line and field."""

    def __init__(self, path: Path | str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path, self.line = str(path), line


@dataclass(frozen=True)
class ClusterConfig:
    nodes: int
    gpus_per_node: int
    gpu: str

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def spec(self) -> ClusterSpec:
        """The planner's preset, with this cluster's node size as the allocation unit."""
        preset = CLUSTERS.get(self.gpu.lower())
        n = self.gpus_per_node
        return replace(preset, gpus_per_node=n, unit_slots=n, max_tp=min(preset.max_tp, n))


@dataclass(frozen=True)
class JobConfig:
    name: str
    params_b: float
    weight: float
    min_gpus: int
    max_gpus: int
    arrival_s: float = 0.0
    length_s: float | None = None
    checkpoint_interval_s: float = 1800.0


def _read(path: Path) -> tuple[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(path, 0, f"cannot read: {exc.strerror}") from exc
    try:
        return text, json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(path, exc.lineno, f"not valid JSON: {exc.msg}") from exc


def _line(text: str, start: int, end: int, field: str | None) -> int:
    """Line of ``"field"`` inside text[start:end], else of ``start``."""
    at = text.find(f'"{field}"', start, end) if field else -1
    return text.count("\n", 0, at if at >= 0 else start) + 1


def _spans(text: str) -> list[tuple[int, int]]:
    """Character span of each element of the top-level JSON array in ``text``."""
    decoder, spans = json.JSONDecoder(), list[tuple[int, int]]()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return spans
        _, end = decoder.raw_decode(text, i)
        spans.append((i, end))
        i = end


def _number(
    raw: dict[str, Any], field: str, kind: type, default: Any = None, low: float = 0.0
) -> Any:
    if field not in raw:
        if default is None:
            raise KeyError(field)
        return default
    value = raw[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field}: expected a number, got {value!r}")
    if kind is int and value != int(value):
        raise ValueError(f"{field}: expected a whole number, got {value!r}")
    if value < low:
        raise ValueError(f"{field}: must be ≥ {low:g}, got {value!r}")
    return kind(value)


def load_cluster(path: Path) -> ClusterConfig:
    text, raw = _read(path)
    if not isinstance(raw, dict):
        raise InputError(path, 1, "expected an object like {'nodes': 16, 'gpus_per_node': 8}")
    field = "nodes"
    try:
        nodes = _number(raw, "nodes", int, low=1)
        field = "gpus_per_node"
        per_node = _number(raw, "gpus_per_node", int, default=8, low=1)
        field = "gpu"
        config = ClusterConfig(nodes, per_node, str(raw.get("gpu", "a100")))
        config.spec  # noqa: B018 — an unknown preset raises here
    except KeyError as exc:
        raise InputError(path, _line(text, 0, len(text), field), f"{field}: {exc}") from exc
    except ValueError as exc:
        raise InputError(path, _line(text, 0, len(text), field), str(exc)) from exc
    return config


def load_jobs(path: Path, cluster: ClusterConfig) -> list[JobConfig]:
    text, raw = _read(path)
    if not isinstance(raw, list) or not raw:
        raise InputError(path, 1, "expected a non-empty list of job objects")
    jobs: list[JobConfig] = []
    for (start, end), item in zip(_spans(text), raw, strict=True):
        try:
            job = _job(item, cluster, len(jobs))
        except _FieldError as exc:
            raise InputError(path, _line(text, start, end, exc.field), exc.message) from exc
        if any(j.name == job.name for j in jobs):
            raise InputError(path, _line(text, start, end, "name"), f"name: {job.name!r} twice")
        jobs.append(job)
    return jobs


class _FieldError(Exception):
    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def _job(item: Any, cluster: ClusterConfig, index: int) -> JobConfig:
    if not isinstance(item, dict):
        raise _FieldError(None, f"job {index}: expected an object")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise _FieldError("name" if "name" in item else None, "name: expected a non-empty string")
    values: dict[str, Any] = {}
    fields = (
        ("params_b", float, None, 0.01),
        ("weight", float, None, 0.0),
        ("min_gpus", int, None, 1),
        ("max_gpus", int, None, 1),
        ("arrival_s", float, 0.0, 0.0),
        ("length_s", float, -1.0, 1.0),
        ("checkpoint_interval_s", float, 1800.0, 1.0),
    )
    for field, kind, default, low in fields:
        try:
            values[field] = _number(item, field, kind, default, low)
        except KeyError:
            raise _FieldError(None, f"job {name!r}: missing field {field!r}") from None
        except ValueError as exc:
            raise _FieldError(field, f"job {name!r}: {exc}") from None
    n = cluster.gpus_per_node
    for field in ("min_gpus", "max_gpus"):
        if values[field] % n:
            raise _FieldError(field, f"job {name!r}: {field} must be a multiple of {n} (a node)")
    if values["max_gpus"] < values["min_gpus"]:
        raise _FieldError("max_gpus", f"job {name!r}: max_gpus is below min_gpus")
    length = values.pop("length_s")
    return JobConfig(name=name, length_s=None if length < 0 else length, **values)


def load_calibration(path: Path) -> Calibration:
    """The planner's calibration as ``GET /v1/calibration`` / ``unicron calibration`` export it
    (:class:`unicron.shared.contracts.calibration.CalibrationRecord`; a hand-written file may set
    only ``transition_factors`` and ``failure_rate_per_gpu_h``), so the simulator prices transitions
    with the same calibrated numbers the planner uses."""
    text, raw = _read(path)
    try:
        record = CalibrationRecord.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        field = str(error["loc"][-1]) if error["loc"] else None
        line = _line(text, 0, len(text), field)
        raise InputError(path, line, f"{where or 'calibration'}: {error['msg']}") from exc
    try:
        return calibration_of(record)
    except ValueError as exc:
        field = str(exc).split(":", 1)[0].rsplit(".", 1)[-1]
        raise InputError(path, _line(text, 0, len(text), field), str(exc)) from exc
