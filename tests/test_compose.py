"""deploy/compose.yaml runs the same modules as `unicron up`, with settings the services read."""

from __future__ import annotations

import importlib
import inspect
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from unicron.cli.stack import AGENT_MODULE, SERVICE_MODULES

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
        assert svc["environment"]["UNICRON_REDIS_URL"].startswith("redis://redis:6379")


def test_compose_api_port_agrees_with_settings() -> None:
    api = _compose()["services"]["api"]
    port = api["environment"]["UNICRON_API_PORT"]
    assert api["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert str(_settings_class("unicron.services.api")().api_port) == port == "8080"


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_compose_file_is_valid() -> None:
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
