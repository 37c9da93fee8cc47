"""Detector settings (``UNICRON_*`` environment variables)."""

from __future__ import annotations

from shared.settings import CommonSettings


class DetectorSettings(CommonSettings):
    correlation_window_s: float = 0.15
    node_check_interval_s: float = 0.25
    reconcile_interval_s: float = 2.0
