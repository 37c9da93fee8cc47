"""Where one rank's checkpoints go and where a restart finds them (docs/design.md §5).

No filesystem is shared between nodes. Every rank holds the whole model and optimizer (the
trainer is data parallel), so a copy on every node costs no network: each node keeps one copy
of each checkpoint in its own directory, written by one rank of that node —

- rank 0 claims the step (:func:`unicron.trainer.checkpoint.claim`) *before* the step's all-reduce,
  the other ranks after it, so on rank 0's node rank 0 always wins: no rank of the step can
  leave the all-reduce before rank 0 entered it. On any other node the first rank to claim
  writes. A rank that loses a claim only pays one failed ``open``.
- rank 0 also uploads its copy to object storage when ``UNICRON_CHECKPOINT_URL`` is set
  (:mod:`unicron.trainer.objectstore`), so a restart can continue even if no node of the old job is
  left.

On a restart every rank offers the newest copy it can reach (its node's newest, and for rank
0 also the object store's); :mod:`unicron.trainer.resume` picks the newest and its holder sends it.

``torch.distributed.checkpoint`` is not used: it is for state sharded across ranks (FSDP,
tensor parallel), where each rank saves and loads only its shard. Here every rank holds the
same full state, so one rank per node writes one ordinary file.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.workerchannel import WorkerEnv, WorkerLaunch
from unicron.shared.logging import get_logger
from unicron.trainer import checkpoint
from unicron.trainer.objectstore import RemoteCheckpoints, Uploader

log = get_logger(component="unicron.trainer.storage")

# How long a run that finished waits for its last upload before it leaves without it.
UPLOAD_DRAIN_S = 300.0


def due(spec: JobSpec, step: int) -> bool:
    """Whether the job checkpoints after ``step``: every ``checkpoint_every`` and the last."""
    return step % spec.checkpoint_every == 0 or step == spec.steps


class Offer(NamedTuple):
    """A checkpoint one rank can reach: on its node's disk (``local``) or in object storage."""

    step: int
    local: bool


class CheckpointStore:
    """This rank's checkpoints: its node's ``directory`` and, optionally, ``remote``."""

    def __init__(self, directory: str | Path, remote: RemoteCheckpoints | None = None) -> None:
        self.directory = Path(directory)
        self.remote = remote
        self._uploader = Uploader(remote) if remote is not None else None

    @classmethod
    def for_launch(cls, launch: WorkerLaunch, env: WorkerEnv | None = None) -> CheckpointStore:
        url = (env or WorkerEnv.read()).checkpoint_url
        remote = RemoteCheckpoints(url, launch.job_id) if url else None
        return cls(launch.checkpoint_dir, remote)

    # --- writing --------------------------------------------------------------------------

    def claim_before_step(self, launch: WorkerLaunch, step: int) -> bool:
        """Rank 0's claim, taken before the step's collective (see the module doc)."""
        return launch.rank == 0 and self._claim(launch, step)

    def claim_after_step(self, launch: WorkerLaunch, step: int, claimed_before: bool) -> bool:
        """Whether this rank writes the node's copy of ``step``, which has just completed."""
        if launch.rank == 0:
            return claimed_before
        return self._claim(launch, step)

    def _claim(self, launch: WorkerLaunch, step: int) -> bool:
        return due(launch.spec, step) and checkpoint.claim(self.directory, step, launch.generation)

    def write(self, launch: WorkerLaunch, step: int, state: checkpoint.TrainState) -> Path:
        """Write the node's copy of ``step`` (the caller claimed it); rank 0 uploads it."""
        path = checkpoint.save(self.directory, step, state)
        if launch.rank == 0 and self._uploader is not None:
            self._uploader.submit(step, path)
        return path

    def finish(self, timeout_s: float = UPLOAD_DRAIN_S) -> bool:
        """Wait for uploads under way; False when one is abandoned (it leaves no marker)."""
        if self._uploader is None or self._uploader.wait(timeout_s):
            return True
        log.warning("checkpoint upload abandoned", url=self._uploader.remote.url)
        return False

    # --- reading --------------------------------------------------------------------------

    def offer(self, passed_over: set[Offer], remote: bool) -> Offer | None:
        """The newest copy this rank can read, but none of ``passed_over`` (unreadable
        ones); with ``remote`` the object store counts too. At one step the disk wins."""
        offers = [Offer(step, True) for step, _ in checkpoint.list_checkpoints(self.directory)]
        if remote and self.remote is not None:
            offers += [Offer(step, False) for step in self.remote.steps()]
        return max((offer for offer in offers if offer not in passed_over), default=None)

    def load(self, offer: Offer) -> checkpoint.TrainState | None:
        """The state of ``offer``, downloaded into the node's directory first when remote;
        None when it cannot be read."""
        path: Path | None = checkpoint.checkpoint_path(self.directory, offer.step)
        if not offer.local:
            assert self.remote is not None
            path = self.remote.download(offer.step, self.directory)
        return None if path is None else checkpoint.load(path, offer.step)

    def load_newest(self) -> tuple[int, checkpoint.TrainState] | None:
        """The newest readable copy this process reaches alone (its disk, object storage)."""
        passed_over: set[Offer] = set()
        while (offer := self.offer(passed_over, remote=True)) is not None:
            state = self.load(offer)
            if state is not None:
                return offer.step, state
            passed_over.add(offer)
        return None

    def forget_unfinished_claims(self) -> None:
        checkpoint.drop_unfinished_claims(self.directory)
