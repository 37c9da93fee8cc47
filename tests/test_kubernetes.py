"""deploy/kubernetes renders with `kubectl kustomize`, every object is valid Kubernetes, and it
deploys what a user relies on; deploy/Dockerfile puts every folder of the package in the image."""

from __future__ import annotations

import base64
import functools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from unicron.cli.stack import AGENT_MODULE, SERVICE_MODULES
from unicron.shared.settings import SECRETS_ENV_FILE

from tests.test_compose import _settings_class

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
SECRET_WORDS = re.compile(r"PASSWORD|TOKEN|SECRET|REDIS_URL", re.IGNORECASE)

needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl not on PATH: cannot render deploy/kubernetes"
)


@functools.cache
def _rendered() -> tuple[dict[str, Any], ...]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(KUSTOMIZE)], capture_output=True, text=True, check=True
    ).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def _objects(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in _rendered() if o["kind"] == kind}


def _containers(obj: dict[str, Any], init: bool = False) -> list[dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"]
    return list(spec.get("containers", [])) + (list(spec.get("initContainers", [])) if init else [])


def _unicron_workloads() -> Iterator[tuple[dict[str, Any], dict[str, Any], str]]:
    """(workload, container, module) of every container that runs a Unicron service."""
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        for obj in _objects(kind).values():
            for container in _containers(obj):
                command = container.get("command", [])
                if command[:2] == ["python", "-m"]:
                    yield obj, container, command[2]


@needs_kubectl
def test_every_rendered_object_is_valid_kubernetes() -> None:
    version = kubernetes_validate.latest_version()
    kinds = set()
    for obj in _rendered():
        kubernetes_validate.validate(obj, version, strict=True)  # raises naming the field
        kinds.add(obj["kind"])
    assert {"Namespace", "Deployment", "DaemonSet", "StatefulSet", "Secret"} <= kinds


@needs_kubectl
def test_runs_every_module_unicron_up_runs_with_probes() -> None:
    workloads = list(_unicron_workloads())
    assert {module for _, _, module in workloads} == {*SERVICE_MODULES, AGENT_MODULE}
    for obj, container, module in workloads:
        if module == AGENT_MODULE:
            assert obj["kind"] == "DaemonSet"
            continue
        assert obj["kind"] == "Deployment", module
        for probe in ("livenessProbe", "readinessProbe"):
            assert probe in container, f"{module} has no {probe}"
    api = next(c for _, c, m in workloads if m == "unicron.services.api")
    assert api["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"


@needs_kubectl
def test_exec_probes_run_modules_that_exist() -> None:
    for _, container, module in _unicron_workloads():
        for probe in ("livenessProbe", "readinessProbe"):
            command = container.get(probe, {}).get("exec", {}).get("command", [])
            if command[:2] == ["python", "-m"]:
                path = ROOT / Path(*command[2].removeprefix("unicron.").split("."))
                assert path.with_suffix(".py").is_file() or path.is_dir(), (module, command)


@needs_kubectl
def test_env_vars_are_settings_the_services_read() -> None:
    [settings] = [c for n, c in _objects("ConfigMap").items() if n.startswith("unicron-settings")]
    common = set(settings["data"])
    for _, container, module in _unicron_workloads():
        fields = _settings_class(module).model_fields
        for key in common | {e["name"] for e in container.get("env", [])}:
            assert key.removeprefix("UNICRON_").lower() in fields, f"{module} does not read {key}"


@needs_kubectl
def test_agent_daemonset_gets_the_gpu_node() -> None:
    [agent] = _objects("DaemonSet").values()
    pod = agent["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    env = {e["name"]: e for e in container["env"]}
    assert int(env["UNICRON_SLOTS"]["value"]) == gpus
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert mounts["/dev/shm"]["emptyDir"]["medium"] == "Memory"
    data_dir = next(c for n, c in _objects("ConfigMap").items() if n.startswith("unicron-settings"))
    assert "hostPath" in mounts[data_dir["data"]["UNICRON_DATA_DIR"]]
    [init] = pod["initContainers"]  # the node id comes from the node's name
    assert {e["name"]: e for e in init["env"]}["NODE_NAME"]["valueFrom"]["fieldRef"] == {
        "fieldPath": "spec.nodeName"
    }


@needs_kubectl
def test_nats_is_three_servers_with_jetstream() -> None:
    nats = _objects("StatefulSet")["nats"]
    assert nats["spec"]["replicas"] == 3
    assert nats["spec"]["volumeClaimTemplates"]
    [config] = [c for n, c in _objects("ConfigMap").items() if n.startswith("nats-config")]
    text = config["data"]["nats.conf"]
    assert re.search(r"^jetstream\s*\{", text, re.MULTILINE)
    routes = re.findall(r"nats-(\d)\.nats-headless:6222", text)
    assert sorted(routes) == ["0", "1", "2"]
    assert "nats-headless" in _objects("Service")
    settings = _settings()  # the services know every server, and replicate every stream
    assert sorted(re.findall(r"nats-(\d)\.nats-headless", settings["UNICRON_NATS_URL"])) == [
        "0", "1", "2",
    ]  # fmt: skip
    assert settings["UNICRON_STREAM_REPLICAS"] == "3"


@needs_kubectl
def test_redis_has_a_replica_and_three_sentinels() -> None:
    statefulsets = _objects("StatefulSet")
    assert statefulsets["redis"]["spec"]["replicas"] == 2
    assert statefulsets["redis-sentinel"]["spec"]["replicas"] == 3
    sentinels = _settings()["UNICRON_REDIS_SENTINELS"]  # the services find the primary there
    assert sorted(re.findall(r"redis-sentinel-(\d)\.redis-sentinel-headless:26379", sentinels)) == [
        "0", "1", "2",
    ]  # fmt: skip
    for workload, container, _ in _unicron_workloads():  # and log in to the Sentinels
        names = {e["name"] for e in container.get("env", [])}
        assert "UNICRON_REDIS_SENTINEL_PASSWORD" in names, workload["metadata"]["name"]


def _settings() -> dict[str, str]:
    [config] = [c for n, c in _objects("ConfigMap").items() if n.startswith("unicron-settings")]
    return dict(config["data"])


@needs_kubectl
def test_every_secret_value_comes_from_a_secret() -> None:
    secrets = set(_objects("Secret"))
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        for obj in _objects(kind).values():
            for container in _containers(obj, init=True):
                for var in container.get("env", []):
                    if SECRET_WORDS.search(var["name"]):
                        assert "value" not in var, f"{var['name']} is a literal"
                        assert var["valueFrom"]["secretKeyRef"]["name"] in secrets
                for source in container.get("envFrom", []):
                    if "secretRef" in source:
                        assert source["secretRef"]["name"] in secrets
    for _, container, module in _unicron_workloads():  # each logs in from its own file
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert str(Path(SECRETS_ENV_FILE).parent) in mounts, module
    for config in _objects("ConfigMap").values():
        for key, value in config["data"].items():
            assert not SECRET_WORDS.search(key), key
            assert "PLACEHOLDER" not in value, key


@needs_kubectl
def test_committed_secrets_are_placeholders() -> None:
    for secret in _objects("Secret").values():
        for key in secret["data"]:
            assert b"PLACEHOLDER" in base64.b64decode(secret["data"][key]), key
