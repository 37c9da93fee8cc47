"""PNG plots of a run: WAF over time for every policy on one chart (hourly means above,
accumulated below), and the GPUs each job held over time, one panel per policy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np
from unicron.simulator.metrics import Timeline

DAY = 86400.0


def _hourly(t: np.ndarray, accumulated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact mean WAF per hour, from the accumulated WAF (so a recovery of minutes between two
    samples shows as the dip it causes, and nothing is missed between samples)."""
    dt = np.diff(t)
    if dt.size == 0:
        return t / DAY, np.zeros_like(t)
    hours = (t[:-1] // 3600).astype(np.int64)
    work = np.bincount(hours, weights=np.diff(accumulated))
    span = np.bincount(hours, weights=dt)
    keep = span > 0
    return np.flatnonzero(keep) * 3600.0 / DAY, work[keep] / span[keep]


def plot_waf(timelines: Sequence[Timeline], path: Path, title: str) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for tl in timelines:
        t = np.asarray(tl.time_s)
        x, y = _hourly(t, np.asarray(tl.accumulated))
        top.plot(x, y / 1e15, label=tl.policy, linewidth=1.2)
        bottom.plot(t / DAY, np.asarray(tl.accumulated) / 1e21, label=tl.policy, linewidth=1.5)
    top.set_ylabel("WAF (weighted PFLOP/s, hourly mean)")
    bottom.set_ylabel("accumulated WAF (weighted ZFLOP)")
    bottom.set_xlabel("time (days)")
    top.set_title(title)
    top.legend(loc="lower left", ncol=len(timelines))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_gpus(timelines: Sequence[Timeline], path: Path) -> Path:
    fig, axes = plt.subplots(
        len(timelines), 1, figsize=(10, 2.2 * len(timelines) + 1), sharex=True, squeeze=False
    )
    for ax, tl in zip(axes[:, 0], timelines, strict=True):
        t = np.asarray(tl.time_s) / DAY
        gpus = np.asarray(tl.gpus, dtype=float).T if tl.gpus else np.zeros((len(tl.jobs), 0))
        ax.stackplot(t, gpus, labels=tl.jobs)
        ax.set_ylabel(f"{tl.policy}\nGPUs")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper left", ncol=min(len(timelines[0].jobs), 6), fontsize=7)
    axes[-1, 0].set_xlabel("time (days)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
