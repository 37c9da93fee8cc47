"""A plain script's checkpoint directory as a snapshot away from its node: the manifest record.

A script keeps its checkpoints under ``$UNICRON_CHECKPOINT_DIR``, a directory on the node of its
rank 0. The agent there snapshots that directory while the script runs and keeps the newest
snapshot in a store every node reaches (:mod:`unicron.services.agent.mirror`); the agent of the
next rank 0 restores it before the ranks start. The manifest says which snapshot is newest and
vouches for its bytes: it is written after the data, so a snapshot without one is incomplete.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CheckpointSnapshot(BaseModel):
    """One snapshot of a job's checkpoint directory, as a tar object named ``blob``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str
    generation: int = Field(ge=0, description="the job's generation whose rank 0 wrote it")
    node_id: str = Field(description="the node whose directory it is")
    newest_mtime_ns: int = Field(ge=0, description="the newest file's mtime, on that node")
    files: int = Field(ge=0)
    size: int = Field(ge=0, description="bytes of the tar")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    blob: str = Field(description="the tar's object name in the store")

    @property
    def order(self) -> tuple[int, int]:
        """Newer sorts higher: a later generation wins, then the later write on that node."""
        return (self.generation, self.newest_mtime_ns)
