"""Who a worker is, defined once: the rank of a job's generation it serves, and its node.

``JobRank`` is one rank of one generation of a job, the seat a command names;
``WorkerIdentity`` adds the node that runs it, as every report carries it. Messages take these
as bases, so the fields stay flat at the top level of their JSON, in the order they always had.
``WorkerKey`` is the same rank as a hashable tuple, for keying a node's workers; :func:`who`
gives the fields of a report from one, to unpack into its model.
"""

from __future__ import annotations

from typing import NamedTuple, TypedDict

from pydantic import BaseModel, ConfigDict


class WorkerKey(NamedTuple):
    job_id: str
    generation: int
    rank: int


class JobRank(BaseModel):
    """One rank of one generation of a job."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    generation: int
    rank: int

    @property
    def key(self) -> WorkerKey:
        return WorkerKey(self.job_id, self.generation, self.rank)


class _OnNode(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node_id: str


# The bases in this order put node_id first: pydantic lays out fields base by base from the
# last one, and the reports' JSON has always begun with node_id.
class WorkerIdentity(JobRank, _OnNode):
    """A worker: the rank of a job's generation it serves, on the node that runs it."""


class Who(TypedDict):
    """The identity fields of a report from a worker, to unpack: ``WorkerPhase(**who, ...)``."""

    node_id: str
    job_id: str
    generation: int
    rank: int


def who(node_id: str, key: WorkerKey) -> Who:
    return Who(node_id=node_id, job_id=key.job_id, generation=key.generation, rank=key.rank)
