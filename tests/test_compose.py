"""deploy/compose.yaml runs the same modules as `unicron up`, with settings the services read."""

from __future__ import annotations

import importlib
import inspect
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings
from unicron.cli.stack import AGENT_MODULE, SERVICE_MODULES
from unicron.shared.settings import SECRETS_ENV_FILE

COMPOSE = Path(__file__).resolve().parents[1] / "deploy" / "compose.yaml"


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def _settings_class(module: str) -> type[BaseSettings]:
    settings_module = importlib.import_module(f"{module}.settings")
    classes = [
        cls
        for _, cls in inspect.getmembers(settings_module, inspect.isclass)
        if issubclass(cls, BaseSettings) and cls.__module__ == settings_module.__name__
    ]
    assert len(classes) == 1, f"{module}.settings should define one settings class"
    return classes[0]


def _unicron_services() -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in _compose()["services"].items()
        if svc.get("command", [None])[0] == "python"
    }


def test_compose_runs_every_module_unicron_up_runs() -> None:
    modules = {svc["command"][2] for svc in _unicron_services().values()}
    assert modules == {*SERVICE_MODULES, AGENT_MODULE}
    for svc in _unicron_services().values():
        assert svc["command"][:2] == ["python", "-m"]
    agents = [s for s in _unicron_services().values() if s["command"][2] == AGENT_MODULE]
    assert len(agents) == 2
    assert len({a["environment"]["UNICRON_NODE_ID"] for a in agents}) == 2


def test_compose_env_vars_are_settings_the_services_read() -> None:
    for name, svc in _unicron_services().items():
        fields = _settings_class(svc["command"][2]).model_fields
        for key in svc["environment"]:
            assert key.startswith("UNICRON_"), f"{name}: {key}"
            assert key.removeprefix("UNICRON_").lower() in fields, f"{name} does not read {key}"
        assert svc["environment"]["UNICRON_NATS_URL"] == "nats://nats:4222"


def test_compose_api_port_agrees_with_settings() -> None:
    api = _compose()["services"]["api"]
    port = api["environment"]["UNICRON_API_PORT"]
    assert api["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert str(_settings_class("unicron.services.api")().api_port) == port == "8080"


def _login_of(svc: dict[str, Any]) -> str:
    """The user a service logs in as: the source of the secret mounted as its settings."""
    [login] = [s for s in svc.get("secrets", []) if s["target"] == "unicron.env"]
    source = str(login["source"])
    assert source.endswith("-login")
    return source.removesuffix("-login")


def test_each_container_logs_in_as_itself_from_its_own_secret() -> None:
    """No credential in the environment; each service's own user, from a secret file that
    deploy/make_secrets.py writes (SECRETS_ENV_FILE is where the settings look for it)."""
    assert SECRETS_ENV_FILE == "/run/secrets/unicron.env"
    services = _unicron_services()
    for name, svc in services.items():
        secret_keys = {"UNICRON_NATS_PASSWORD", "UNICRON_NATS_USER", "UNICRON_REDIS_URL"}
        assert not secret_keys & set(svc["environment"]), name
        module = svc["command"][2]
        node_id = svc["environment"].get("UNICRON_NODE_ID")
        expected = f"agent-{node_id}" if module == AGENT_MODULE else module.split(".")[-1]
        assert _login_of(svc) == expected, name
    logins = [_login_of(svc) for svc in services.values()]
    assert len(set(logins)) == len(logins)  # nobody shares a login


def test_make_secrets_writes_every_secret_the_compose_file_mounts(tmp_path: Path) -> None:
    compose = _compose()
    agents = [s for s in _unicron_services().values() if s["command"][2] == AGENT_MODULE]
    nodes = ",".join(a["environment"]["UNICRON_NODE_ID"] for a in agents)
    script = COMPOSE.parent / "make_secrets.py"
    run = [sys.executable, str(script), "--nodes", nodes, "--out", str(tmp_path)]
    subprocess.run(run, check=True, capture_output=True)
    for name, secret in compose["secrets"].items():
        assert (tmp_path / Path(secret["file"]).name).is_file(), name
    api_env = dict(
        line.split("=", 1) for line in (tmp_path / "api.env").read_text().splitlines()
    )  # fmt: skip
    assert api_env["UNICRON_NATS_USER"] == "api"
    assert api_env["UNICRON_REDIS_URL"].startswith("redis://api:")
    assert api_env["UNICRON_REDIS_URL"].endswith("@redis:6379/0")
    assert "user default off" in (tmp_path / "users.acl").read_text()
    assert api_env["UNICRON_NATS_PASSWORD"] in (tmp_path / "nats.conf").read_text()


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_compose_file_is_valid() -> None:
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


OBSERVABILITY = COMPOSE.parent / "observability"


def _mounts(service: str) -> dict[str, str]:
    """Bind mounts of a compose service: target in the container -> source under deploy/."""
    volumes = [v.split(":") for v in _compose()["services"][service]["volumes"]]
    return {target: source for source, target, *_ in volumes if source.startswith("./")}


def test_prometheus_scrapes_each_service_on_the_port_it_serves_metrics_on() -> None:
    """Compose's Prometheus scrapes each Unicron container, in the scrape job named after its
    service, on the port its settings serve /metrics on (the API: its API port)."""
    config = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
    scraped = {
        job["job_name"]: sorted(t for c in job["static_configs"] for t in c["targets"])
        for job in config["scrape_configs"]
    }
    expected: dict[str, list[str]] = {}
    for name, svc in _unicron_services().items():
        module = svc["command"][2]
        env = svc["environment"]
        port = env.get("UNICRON_API_PORT") or env.get("UNICRON_METRICS_PORT")
        port = port or _settings_class(module).model_fields["metrics_port"].default
        assert int(port) > 0, f"{name} serves no /metrics"
        expected.setdefault(f"unicron-{module.rsplit('.', 1)[1]}", []).append(f"{name}:{port}")
    assert scraped == {job: sorted(targets) for job, targets in expected.items()}


def test_prometheus_and_grafana_mount_the_files_they_read() -> None:
    for service in ("prometheus", "grafana"):
        for source in _mounts(service).values():
            assert (COMPOSE.parent / source).exists(), f"{service} mounts a missing {source}"
    prometheus = _mounts("prometheus")
    assert prometheus["/etc/prometheus/prometheus.yml"] == "./observability/prometheus.yml"
    config = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
    for rules in config["rule_files"]:  # read beside the config file
        assert prometheus[f"/etc/prometheus/{rules}"] == f"./observability/{rules}"
    grafana = _mounts("grafana")
    assert grafana["/etc/grafana/provisioning"] == "./observability/grafana/provisioning"
    provisioning = OBSERVABILITY / "grafana" / "provisioning"
    [provider] = yaml.safe_load((provisioning / "dashboards" / "unicron.yml").read_text())[
        "providers"
    ]
    dashboards = provider["options"]["path"]
    assert grafana[dashboards] == "./observability/grafana/dashboards"
    home = _compose()["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    assert (OBSERVABILITY / "grafana" / "dashboards" / Path(home).relative_to(dashboards)).is_file()
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090"
    assert _compose()["services"]["prometheus"]["ports"] == ["127.0.0.1:9090:9090"]
