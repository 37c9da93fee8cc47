"""The job spec: what a user submits to run a job, checked strictly at the door.

``JobSpec`` is the body of ``POST /v1/jobs`` and part of every job record; it is re-exported by
:mod:`unicron.shared.contracts.models`. Every number is strictly typed, finite and bounded and every
string bounded, so no spec the API accepted can fail to round-trip through JSON or break a reader.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)


class ModelConfig(BaseModel):
    """Shape of the reference GPT; the defaults give about 0.8 million parameters."""

    model_config = ConfigDict(extra="forbid")

    n_layer: StrictInt = Field(4, ge=1, le=96)
    n_head: StrictInt = Field(4, ge=1, le=128)
    d_model: StrictInt = Field(128, ge=8, le=16384)
    seq_len: StrictInt = Field(64, ge=2, le=32768)
    vocab: StrictInt = Field(256, ge=2, le=1_000_000)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> Self:
        if self.d_model % self.n_head:
            raise ValueError("d_model must be a multiple of n_head")
        return self


PACKAGE_SCHEME = "pkg://"
PACKAGE_REF = re.compile(r"^pkg://([0-9a-f]{64})$")


class PackageStored(BaseModel):
    """An uploaded package: its sha256, size, and the ``working_dir`` a job names it by."""

    sha256: str
    size: int
    working_dir: str


# Variables the agent sets for every worker: a job's env must not override them.
RESERVED_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_NAME",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
    }
)
RESERVED_ENV_PREFIXES = ("UNICRON_", "TORCHELASTIC_")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_ARG_CHARS = 4096
MAX_ENV_VALUE_CHARS = 32768


def _no_nul(value: str) -> str:
    if "\0" in value:
        raise ValueError("must not contain a NUL character")
    return value


Arg = Annotated[StrictStr, Field(min_length=1, max_length=MAX_ARG_CHARS), AfterValidator(_no_nul)]
EnvValue = Annotated[StrictStr, Field(max_length=MAX_ENV_VALUE_CHARS), AfterValidator(_no_nul)]


def _env_name(name: str) -> str:
    if not _ENV_NAME.match(name):
        raise ValueError(f"{name!r} is not a valid environment variable name")
    if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
        raise ValueError(f"{name!r} is set by Unicron for every worker; a job may not set it")
    return name


EnvName = Annotated[StrictStr, Field(max_length=256), AfterValidator(_env_name)]


def _working_dir(value: str) -> str:
    """An absolute, normalised path (it must exist on every node) or ``pkg://<sha256>``."""
    _no_nul(value)
    if value.startswith(PACKAGE_SCHEME):
        if not PACKAGE_REF.match(value):
            raise ValueError("a package must be pkg:// and the 64 lowercase hex of its sha256")
        return value
    if not value.startswith("/") or os.path.normpath(value) != value or value.startswith("//"):
        raise ValueError("must be an absolute, normalised path (no '.', '..' or '//') or pkg://")
    return value


WorkingDir = Annotated[StrictStr, Field(max_length=4096), AfterValidator(_working_dir)]


class JobSpec(BaseModel):
    """What a user submits: the body of ``POST /v1/jobs``.

    Every number is strictly typed (``true`` is not 1, ``"2"`` is not 2), finite and bounded:
    a spec is stored and re-read by every service, so one that cannot round-trip through JSON
    must be refused here. A job runs the reference trainer ``trainer`` unless it gives its own
    ``entrypoint`` (an argv, run in ``working_dir`` with torchrun's environment).
    """

    model_config = ConfigDict(extra="forbid")

    name: StrictStr = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    trainer: Literal["gpt"] = "gpt"
    steps: StrictInt = Field(100, gt=0, le=10_000_000)
    global_batch: StrictInt = Field(16, gt=0, le=1 << 24)
    micro_batch: StrictInt = Field(4, gt=0, le=1 << 24)
    min_workers: StrictInt = Field(1, ge=1, le=65_536)
    max_workers: StrictInt = Field(4, ge=1, le=65_536)
    weight: StrictFloat = Field(1.0, gt=0, le=1e6, allow_inf_nan=False)
    seed: StrictInt = Field(0, ge=0, le=2**63 - 1)
    checkpoint_every: StrictInt = Field(20, gt=0, le=10_000_000)
    model: ModelConfig = Field(default_factory=lambda: ModelConfig())
    entrypoint: list[Arg] | None = Field(
        None, min_length=1, max_length=256, description="the user's command line (argv)"
    )
    working_dir: WorkingDir | None = Field(
        None, description="where the worker starts: a path on every node, or pkg://<sha256>"
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, max_length=256, description="extra environment of every worker"
    )
    max_restarts: StrictInt = Field(
        3,
        ge=0,
        le=1000,
        description="restarts after failures of the job's own: its code's, or ones that follow "
        "it to other nodes",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.min_workers > self.max_workers:
            raise ValueError("min_workers must not exceed max_workers")
        if self.global_batch % self.micro_batch:
            raise ValueError("global_batch must be a multiple of micro_batch")
        if self.global_batch // self.micro_batch < self.min_workers:
            raise ValueError("global_batch / micro_batch must be at least min_workers")
        if self.entrypoint is not None and sum(map(len, self.entrypoint)) > 64 * 1024:
            raise ValueError("entrypoint must be at most 64 KiB in all")
        return self

    @property
    def micro_batches(self) -> int:
        return self.global_batch // self.micro_batch

    @property
    def package(self) -> str | None:
        """The sha256 of the job's uploaded package, when its working_dir is one."""
        match = PACKAGE_REF.match(self.working_dir or "")
        return match.group(1) if match else None
