"""Settings common to every service; each service extends ``CommonSettings`` with its own.

All settings come from ``UNICRON_*`` environment variables, a ``.env`` file, or the
``/run/secrets/unicron.env`` file a container gets as a secret (docs/design.md §11).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from unicron.shared.addresses import SentinelTarget, parse_sentinels
from unicron.shared.bus.natsauth import NatsTls
from unicron.shared.bus.natslogin import NatsAccess
from unicron.shared.contracts.roles import CredentialsError
from unicron.shared.store.jobindex import JOB_RETENTION_S

# Where deploy/compose.yaml mounts a service's own credentials (later files win over .env;
# real environment variables win over both).
SECRETS_ENV_FILE = "/run/secrets/unicron.env"


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="UNICRON_", env_file=(".env", SECRETS_ENV_FILE), extra="ignore"
    )

    # One server, or a cluster's servers comma-separated (checked where the client connects,
    # shared/addresses.py: a validator's message would repeat a password in the URL).
    nats_url: str = "nats://127.0.0.1:4222"
    # On how many NATS servers each stream keeps its messages: 3 with a 3-server cluster, so
    # that losing any one server loses nothing acknowledged (shared/bus/bus.py).
    stream_replicas: int = Field(1, ge=1, le=5)
    # This process's NATS login; unset: anonymous, which only a development server accepts.
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    # The CA that signed a tls:// server's certificate, when it is not a public one.
    nats_tls_ca: Path | None = None
    # The certificate and key ``unicron up``'s embedded NATS serves TLS with.
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    # With an ACL'd Redis: redis://USER:PASSWORD@HOST:PORT/DB.
    redis_url: str = "redis://127.0.0.1:6379/0"
    # host:port,host:port,...: find the primary through these Sentinels instead of at
    # redis_url's host (whose user, password and database still count; shared/store/sentinel.py).
    redis_sentinels: str | None = None
    redis_master: str = Field("unicron", min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    redis_sentinel_password: SecretStr | None = None
    data_dir: Path = Path(".unicron")
    log_level: str = "INFO"
    log_format: str = "console"
    heartbeat_interval_s: float = 1.0
    heartbeat_misses: int = 3
    # How long a finished job stays readable and listed after it ended; then its record
    # expires (every service that writes jobs sets it). Running and pending jobs never expire.
    job_retention_s: float = Field(JOB_RETENTION_S, gt=0, le=10 * 365 * 86400, allow_inf_nan=False)
    # Where the service serves /metrics for Prometheus (0: not served). Each service has its own
    # default port (the README's "Metrics"); the API serves it on its own port instead.
    metrics_port: int = Field(0, ge=0, le=65535)
    metrics_host: str = "0.0.0.0"

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinels(cls, value: str | None) -> str | None:
        if value is not None and value.strip():
            parse_sentinels(value)  # its ValueError names the bad entry
            return value
        return None

    @property
    def replicas_asked(self) -> int | None:
        """``UNICRON_STREAM_REPLICAS`` when set; None: existing streams keep theirs (a tool run
        with a bare environment must not shrink a cluster's streams to one server)."""
        return self.stream_replicas if "stream_replicas" in self.model_fields_set else None

    @property
    def redis_sentinel(self) -> SentinelTarget | None:
        """Where to find the Redis primary, when Sentinels watch it; None: at redis_url."""
        if self.redis_sentinels is None:
            return None
        password = self.redis_sentinel_password
        return SentinelTarget(
            tuple(parse_sentinels(self.redis_sentinels)),
            self.redis_master,
            password=password.get_secret_value() if password else None,
        )

    @property
    def node_timeout_s(self) -> float:
        """How long a node may stay silent before it counts as lost."""
        return self.heartbeat_interval_s * self.heartbeat_misses

    # Pairs are checked where they are used, not by a validator: pydantic's message would
    # repeat every input, the password included.
    @property
    def nats_access(self) -> NatsAccess:
        _both("nats_user", self.nats_user, "nats_password", self.nats_password)
        return NatsAccess(user=self.nats_user, password=self.nats_password, tls_ca=self.nats_tls_ca)

    @property
    def nats_tls(self) -> NatsTls | None:
        _both("nats_tls_cert", self.nats_tls_cert, "nats_tls_key", self.nats_tls_key)
        if self.nats_tls_cert is None or self.nats_tls_key is None:
            return None
        return NatsTls(cert=self.nats_tls_cert, key=self.nats_tls_key)


def _both(first: str, first_value: object, second: str, second_value: object) -> None:
    if (first_value is None) != (second_value is None):
        names = f"UNICRON_{first.upper()} and UNICRON_{second.upper()}"
        raise CredentialsError(f"{names} go together: set both or neither")
