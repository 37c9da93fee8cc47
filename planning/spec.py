"""What the performance and transition-cost models are parameterised by: model shapes, cluster
descriptions, and the small registry that names the backends.

:class:`ModelShape` is the GPT of a job (``JobSpec.model``) reduced to what costs time: its
parameters and its FLOPs per token. :class:`ClusterSpec` describes one kind of node — compute,
memory, interconnect — and the transition constants measured on it; the presets live in
:mod:`.clusters`. Both are frozen and hashable, so a (shape, cluster) pair keys the cache of best
parallel configurations in :mod:`.perf`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from unicron.shared.contracts.models import ModelConfig

T = TypeVar("T")


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer: layers, heads, width, context length, vocabulary."""

    n_layer: int
    n_head: int
    d_model: int
    seq_len: int
    vocab: int

    @classmethod
    def of(cls, model: ModelConfig) -> ModelShape:
        return cls(model.n_layer, model.n_head, model.d_model, model.seq_len, model.vocab)

    @property
    def params(self) -> float:
        """12·l·h² in the blocks plus the (tied) token and position embeddings."""
        h = self.d_model
        return 12.0 * self.n_layer * h * h + (self.vocab + self.seq_len) * h

    @property
    def layer_flops_per_token(self) -> float:
        """Forward + backward FLOPs of one block per token: 6·12h² (GEMMs) + 12·s·h (attention)."""
        h = self.d_model
        return 72.0 * h * h + 12.0 * self.seq_len * h

    @property
    def logit_flops_per_token(self) -> float:
        return 6.0 * self.vocab * self.d_model

    @property
    def flops_per_token(self) -> float:
        """Model FLOPs per trained token, 6N plus the attention term (Narayanan et al. 2021, eq. 3
        without recomputation; PaLM appendix B): what "achieved FLOP/s" counts in WAF."""
        return self.n_layer * self.layer_flops_per_token + self.logit_flops_per_token


@dataclass(frozen=True)
class ClusterSpec:
    """One kind of node of a homogeneous cluster.

    Bandwidths are per GPU, as the bus bandwidth of an NCCL ring all-reduce: ``intra_bw`` inside a
    node (NVLink/NVSwitch), ``inter_bw`` across nodes (each GPU's share of the node's NICs).
    ``efficiency`` is the best fraction of peak a transformer block sustains (GEMMs near 80%,
    diluted by the memory-bound softmax, norms and activations); it falls off for small GEMMs as
    rows/(rows + rows_half) · width/(width + width_half), rows = tokens of a micro-batch and
    width = hidden size per tensor-parallel rank.
    """

    name: str
    gpus_per_node: int
    peak_flops: float
    memory_bytes: float
    intra_bw: float
    inter_bw: float
    intra_latency_s: float
    inter_latency_s: float
    efficiency: float
    rows_half: float
    width_half: float
    act_bytes: int = 2  # bf16 activations
    grad_bytes: int = 4  # fp32 main gradients are what data parallelism all-reduces
    state_bytes: int = 16  # bf16 weights + fp32 master weights, Adam m and v, per parameter
    recompute: bool = True  # full activation recomputation, as Megatron runs large GPTs
    memory_headroom: float = 0.9  # allocator fragmentation, CUDA context, NCCL buffers
    max_tp: int = 8
    max_pp: int = 128
    tune_micro_batch: bool = True
    unit_slots: int = 8  # the DP hands out whole nodes
    # Transitions (docs/design.md §5): fresh process with its runtime, re-forming a process group in
    # place, retrying a collective in place, and reading a checkpoint from local disk.
    launch_s: float = 30.0
    # A warm spare (runtime already imported) taking a failed rank's seat in a restart; None
    # where none is measured or agents keep none: the replacement is a fresh launch.
    spare_s: float | None = None
    reform_s: float = 2.0
    reattempt_s: float = 1.0
    disk_bw: float = 2e9


# The reference trainer's default model: what a job without a shape is assumed to train.
DEFAULT_SHAPE = ModelShape.of(ModelConfig())


class Registry(Generic[T]):
    """Named backends (cluster presets, throughput models): register once, look up by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T) -> T:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item
        return item

    def decorator(self, name: str) -> Callable[[T], T]:
        return lambda item: self.register(name, item)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items))
            raise KeyError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
