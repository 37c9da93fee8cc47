"""Transition costs: D_trans(t, x_old → x), the seconds of a job's work a change costs it.

:func:`classify` names the transition each worker count means for a job (keep, start, resume,
reattempt, restart, shrink, grow, migrate, stop). Two models price it:

- :class:`ConstantDowntime`: a fixed downtime per kind of change (tests, and a baseline);
- :class:`ModelledDowntime`: from the cluster preset — process launch (a warm spare's takeover
  for a restart where the preset measured one), process-group re-form, in-place reattempt, and
  moving each new rank's shard of the training state from the nearest copy (a data-parallel
  peer over the network, else the checkpoint on disk, redoing the steps since it) — times a
  per-kind factor learnt from the downtimes the executor measures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from unicron.planning.api import (
    KINDS,
    SOURCES,
    Curve,
    FloatArray,
    IntArray,
    JobDemand,
    StateSource,
    TransitionKind,
    Transitions,
)
from unicron.planning.spec import DEFAULT_SHAPE, ClusterSpec
from unicron.shared.contracts.taxonomy import RecoveryAction
from unicron.shared.contracts.transitions import answer_to

K = {kind: np.int64(i) for i, kind in enumerate(KINDS)}
S = {source: np.int64(i) for i, source in enumerate(SOURCES)}


def classify(demand: JobDemand, x: IntArray) -> IntArray:
    """The kind of transition that takes the job to each worker count in ``x``."""
    c, w = demand.current, demand.old_workers
    if w == 0:  # waiting: it starts, or resumes from its checkpoint
        first = K[TransitionKind.RESUME if demand.resume else TransitionKind.START]
        return np.where(x == 0, K[TransitionKind.NONE], first)
    if not demand.hit:
        same = K[TransitionKind.NONE]
    elif c < w:
        same = K[TransitionKind.MIGRATE]
    else:
        same = K[_answer(demand.recovery)]
    base = np.where(x < w, K[TransitionKind.SHRINK], K[TransitionKind.GROW])
    kinds = np.where(x == w, same, base)
    if c < w:  # a count between the survivors and the old size replaces lost ranks
        kinds = np.where((x > c) & (x < w), K[TransitionKind.MIGRATE], kinds)
    if not demand.hit:
        kinds = np.where(x == c, K[TransitionKind.NONE], kinds)
    return np.where(x == 0, K[TransitionKind.STOP], kinds).astype(np.int64)


def _answer(recovery: RecoveryAction | None) -> TransitionKind:
    """What a hit job pays on its own nodes and size: the answer to its failure's action
    (:mod:`unicron.shared.contracts.transitions`). A hit job always pays a transition, so a lost
    rank with no failure recorded, or an action that asks for none, restarts."""
    kind = TransitionKind.NONE if recovery is None else answer_to(recovery)
    return TransitionKind.RESTART if kind == TransitionKind.NONE else kind


@dataclass(frozen=True)
class ConstantDowntime:
    """A fixed downtime per change: restart when hit, start from nothing, resize otherwise."""

    restart_s: float = 10.0
    resize_s: float = 10.0
    start_s: float = 0.0

    def transitions(self, demand: JobDemand, old: Curve, new: Curve) -> Transitions:
        x = new.workers
        if demand.hit:
            # A faulted job restarts whatever it gets, so every choice pays the same.
            downtime = np.full(x.shape, self.restart_s, dtype=np.float64)
        else:
            change = self.start_s if demand.current == 0 else self.resize_s
            downtime = np.where(x == demand.current, 0.0, change).astype(np.float64)
        zeros = np.zeros(x.shape)
        none = np.full(x.shape, S[StateSource.NONE])
        return Transitions(classify(demand, x), none, downtime, zeros, np.ones(x.shape))

    def calibrated(self, factors: Mapping[TransitionKind, float]) -> ConstantDowntime:
        return self


@dataclass(frozen=True)
class ModelledDowntime:
    """Launch, re-form and state-transfer times of ``cluster``, times measured factors."""

    cluster: ClusterSpec
    factors: tuple[tuple[TransitionKind, float], ...] = ()

    def calibrated(self, factors: Mapping[TransitionKind, float]) -> ModelledDowntime:
        return replace(self, factors=tuple(sorted(factors.items())))

    def transitions(self, demand: JobDemand, old: Curve, new: Curve) -> Transitions:
        x = new.workers
        kinds = classify(demand, x)
        source = self._sources(demand, old, kinds)
        shape = demand.shape or DEFAULT_SHAPE
        shard = self.cluster.state_bytes * shape.params / np.maximum(new.tp * new.pp, 1)
        old_shards = int(old.tp[0] * old.pp[0])
        reshard = (new.tp * new.pp != old_shards) & (old_shards > 0)
        downtime = self._modelled(kinds, source, shard, reshard)
        old_step = float(np.nan_to_num(old.iteration_s[0], nan=0.0, posinf=0.0))
        redo = demand.checkpoint_every / 2 * old_step  # a checkpoint is half an interval old
        from_disk = (source == S[StateSource.DISK]) & (kinds != K[TransitionKind.RESUME])
        lost = np.where(from_disk | (kinds == K[TransitionKind.STOP]), redo, 0.0)
        factor = self._factor_array(kinds)
        return Transitions(kinds, source, downtime * factor, lost, factor)

    def _sources(self, demand: JobDemand, old: Curve, kinds: IntArray) -> IntArray:
        """A new rank copies a healthy data-parallel replica when one survives, else disk."""
        replica = int(old.tp[0] * old.pp[0]) or 1
        lost = demand.old_workers - demand.current
        survivor = demand.current >= replica and (not demand.hit or old.dp[0] >= 2)
        peer = S[StateSource.PEER] if survivor and lost < demand.current else S[StateSource.DISK]
        needs = (kinds == K[TransitionKind.RESTART]) | (kinds == K[TransitionKind.MIGRATE])
        needs |= kinds == K[TransitionKind.GROW]
        source = np.where(needs, peer, S[StateSource.NONE])
        return np.where(kinds == K[TransitionKind.RESUME], S[StateSource.DISK], source)

    def _modelled(
        self, kinds: IntArray, source: IntArray, shard: FloatArray, reshard: np.ndarray
    ) -> FloatArray:
        c = self.cluster
        transfer = np.select(
            [source == S[StateSource.PEER], source == S[StateSource.DISK]],
            [shard / c.inter_bw, shard / c.disk_bw],
            0.0,
        )
        launched = c.launch_s + c.reform_s + transfer
        # A restart replaces the failed rank of a running job: the node's warm spare takes it.
        seated = c.launch_s if c.spare_s is None else c.spare_s
        replaced = seated + c.reform_s + transfer
        by_kind = {
            TransitionKind.START: np.full(kinds.shape, c.launch_s),
            TransitionKind.RESUME: c.launch_s + transfer,
            TransitionKind.REATTEMPT: np.full(kinds.shape, c.reattempt_s),
            TransitionKind.RESTART: replaced,
            TransitionKind.GROW: launched,
            TransitionKind.MIGRATE: launched,
            TransitionKind.SHRINK: c.reform_s + np.where(reshard, shard / c.inter_bw, 0.0),
        }
        choices = [kinds == K[kind] for kind in by_kind]
        return np.select(choices, list(by_kind.values()), 0.0).astype(np.float64)

    def _factor_array(self, kinds: IntArray) -> FloatArray:
        table = np.ones(len(KINDS))
        for kind, factor in self.factors:
            table[K[kind]] = factor
        factors: FloatArray = table[kinds]
        return factors
