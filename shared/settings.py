"""Settings common to every service; each service extends ``CommonSettings`` with its own.

All settings come from ``UNICRON_*`` environment variables (or a ``.env`` file).
"""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="UNICRON_", env_file=".env", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    redis_url: str = "redis://127.0.0.1:6379/0"
    data_dir: Path = Path(".unicron")
    log_level: str = "INFO"
    log_format: str = "console"
    heartbeat_interval_s: float = 1.0
    heartbeat_misses: int = 3

    @property
    def node_timeout_s(self) -> float:
        """How long a node may stay silent before it counts as lost."""
        return self.heartbeat_interval_s * self.heartbeat_misses
