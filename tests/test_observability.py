"""deploy/observability: the Prometheus config (compose and Kubernetes), the alert rules and
their unit tests pass promtool; every alert says what fired it; the alerts and the Grafana
dashboard query valid PromQL over the metric catalogue (docs/design.md §13), which is what the
services register."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from unicron.services.executor.metrics import ExecutorMetrics
from unicron.shared.metrics import ServiceMetrics, serve_metrics
from unicron.shared.procs import free_port

from tests.metric_catalogue import catalogue, check_query, exported, series_metric
from tests.waiting import wait_for

OBSERVABILITY = Path(__file__).resolve().parents[1] / "deploy" / "observability"
PROMETHEUS = OBSERVABILITY / "prometheus.yml"
ALERTS = OBSERVABILITY / "alerts.yml"
DASHBOARD = OBSERVABILITY / "grafana" / "dashboards" / "unicron.json"
DATASOURCES = OBSERVABILITY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
POD_NAME = "__meta_kubernetes_pod_label_app_kubernetes_io_name"  # the scrape job's name
KUBERNETES_BEGIN, KUBERNETES_END = "# --- kubernetes: begin ---", "# --- kubernetes: end ---"
# What Grafana substitutes before a query reaches Prometheus; any other `$` is an undefined one.
GRAFANA_MACROS = re.compile(r"\$__(rate_interval|interval|range)\b")

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="no promtool on PATH (Debian: apt install prometheus)"
)


def _promtool(*args: str, cwd: Path = OBSERVABILITY) -> str:
    result = subprocess.run(
        ["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{output}"
    return output


def _alerts() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def _dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, query) of every query on the dashboard."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def _kubernetes_variant() -> str:
    """prometheus.yml with its commented Kubernetes scrape_configs in place of compose's."""
    text = PROMETHEUS.read_text()
    block = text[text.index(KUBERNETES_BEGIN) : text.index(KUBERNETES_END)]
    config = block[block.index("# scrape_configs:") :].splitlines()
    assert all(line.startswith("# ") for line in config), "a line of the block is not commented"
    return text[: text.index("\nscrape_configs:")] + "\n" + "\n".join(line[2:] for line in config)


@needs_promtool
def test_prometheus_config_and_the_rules_it_loads_pass_promtool() -> None:
    output = _promtool("check", "config", PROMETHEUS.name)
    assert f"Checking {ALERTS.name}" in output, output  # the rules were checked with it
    assert "SUCCESS: 7 rules found" in output, output


def _check_config(tmp_path: Path, config: str) -> str:
    (tmp_path / PROMETHEUS.name).write_text(config)
    shutil.copy(ALERTS, tmp_path / ALERTS.name)
    return _promtool("check", "config", PROMETHEUS.name, cwd=tmp_path)


@needs_promtool
def test_the_kubernetes_scrape_config_passes_promtool(tmp_path: Path) -> None:
    """Its relabelling and everything else, the pod discovery swapped for a static target: the
    promtool of Debian's package is built without Kubernetes discovery (next test)."""
    config = yaml.safe_load(_kubernetes_variant())
    [job] = config["scrape_configs"]
    assert job.pop("kubernetes_sd_configs")[0]["role"] == "pod"
    job["static_configs"] = [{"targets": ["10.0.0.1:9101"]}]
    # the API's /metrics takes an admin token there; promtool checks that its file exists
    token = job["authorization"]["credentials_file"]
    assert token.startswith("/etc/prometheus/"), token
    job["authorization"]["credentials_file"] = str(tmp_path / "token")
    (tmp_path / "token").write_text("an admin token\n")
    _check_config(tmp_path, yaml.safe_dump(config))


@needs_promtool
def test_the_kubernetes_pod_discovery_passes_promtool(tmp_path: Path) -> None:
    try:
        _check_config(tmp_path, _kubernetes_variant())
    except AssertionError as exc:
        if "field kubernetes_sd_configs not found" not in str(exc):
            raise
        pytest.skip("this promtool is built without Kubernetes discovery (Debian's package)")


def test_kubernetes_discovery_keeps_each_compose_job_on_the_same_port() -> None:
    compose_jobs = {
        job["job_name"]: {t.rsplit(":", 1)[1] for c in job["static_configs"] for t in c["targets"]}
        for job in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]
    }
    [kubernetes] = yaml.safe_load(_kubernetes_variant())["scrape_configs"]
    rules = kubernetes["relabel_configs"]
    [keep] = [
        r["regex"] for r in rules if r.get("action") == "keep" and r["source_labels"] == [POD_NAME]
    ]
    assert all(re.fullmatch(keep, job) for job in compose_jobs), keep
    ports = {
        r["regex"].split(";")[0]: {r["replacement"].rsplit(":", 1)[1]}
        for r in rules
        if r.get("target_label") == "__address__"
    }
    assert ports == compose_jobs


@needs_promtool
def test_alert_rules_pass_their_unit_tests() -> None:
    output = _promtool("test", "rules", "alerts_test.yml")
    assert "SUCCESS" in output, output


def test_every_alert_is_tested_firing_and_quiet() -> None:
    tests = yaml.safe_load((OBSERVABILITY / "alerts_test.yml").read_text())["tests"]
    cases = [case for test in tests for case in test["alert_rule_test"]]
    for alert in _alerts():
        expected = [bool(c["exp_alerts"]) for c in cases if c["alertname"] == alert]
        assert True in expected, f"no test shows {alert} firing"
        assert False in expected, f"no test shows {alert} quiet where it should be"


def test_every_alert_waits_has_a_severity_and_says_what_fired_it() -> None:
    alerts = _alerts()
    assert set(alerts) == {
        "UnicronServiceDown", "UnicronJobFailed", "UnicronNodeQuarantined", "UnicronNodeLost",
        "UnicronRecoverySlow", "UnicronDeadLetters", "UnicronGpuRetired",
    }  # fmt: skip
    for name, rule in alerts.items():
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        for annotation in ("summary", "description"):
            text = rule["annotations"][annotation]
            assert re.search(r"\{\{[^}]*\$(labels\.\w+|value)", text), f"{name} {annotation}"
        check_query(rule["expr"])


def test_the_catalogue_lists_metrics_the_services_register() -> None:
    missing = sorted(set(catalogue()) - set(exported()))
    assert not missing, f"in docs/design.md's catalogue, registered by no service: {missing}"


def test_dashboard_queries_read_only_catalogue_metrics_and_their_labels() -> None:
    targets = _dashboard_targets()
    assert len(targets) >= 14
    for title, expr in targets:
        assert "$" not in GRAFANA_MACROS.sub("", expr), f"{title}: an undefined variable"
        check_query(expr)
    read = {series_metric(n) for _, e in targets for n in re.findall(r"unicron_\w+", e)}
    for metric in (
        "unicron_waf", "unicron_jobs", "unicron_failures_total", "unicron_nodes",
        "unicron_detection_latency_seconds", "unicron_recovery_downtime_seconds",
        "unicron_job_goodput_seconds_total", "unicron_dead_letters_total",
    ):  # fmt: skip
        assert metric in read, f"the dashboard shows no {metric}"


@needs_promtool
def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """Each query, its Grafana macros filled in, as a recording rule promtool must accept."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": GRAFANA_MACROS.sub("5m", expr)}
        for i, (_, expr) in enumerate(_dashboard_targets())
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    output = _promtool("check", "rules", str(path))
    assert f"SUCCESS: {len(rules)} rules found" in output, output


def test_dashboard_panels_use_the_provisioned_datasource() -> None:
    [source] = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids repeat"
    for panel in panels:
        uids = {panel["datasource"]["uid"]} | {t["datasource"]["uid"] for t in panel["targets"]}
        assert uids == {source["uid"]}, panel["title"]


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5)
    response.raise_for_status()  # 503 while Prometheus starts: the caller waits that out
    answer = response.json()
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="no prometheus server on PATH")
def test_prometheus_stores_a_scraped_training_job_as_job_id(tmp_path: Path) -> None:
    """A real Prometheus, on prometheus.yml's executor job, scrapes an executor's /metrics
    server: a job's series arrive with `job_id` (what the dashboard reads) and the scrape job
    as `job`; the alert rules load."""
    service = ServiceMetrics()
    service.part(ExecutorMetrics).steps_per_second.labels("job-1").set(2.5)
    server = serve_metrics(service, "127.0.0.1", free_port())
    assert server is not None
    config = yaml.safe_load(PROMETHEUS.read_text())
    [executor] = [j for j in config["scrape_configs"] if j["job_name"] == "unicron-executor"]
    executor["static_configs"] = [{"targets": [f"127.0.0.1:{server.port}"]}]
    config |= {"global": {"scrape_interval": "1s"}, "scrape_configs": [executor]}
    _check_config(tmp_path, yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    run = [
        "prometheus", f"--config.file={tmp_path / PROMETHEUS.name}",
        f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address={url[7:]}",
    ]  # fmt: skip
    prometheus = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        steps = "unicron_job_steps_per_second"
        scraped = functools.partial(_query, url, steps)
        [series] = wait_for("the scraped series", scraped, 30, tolerate=(httpx.HTTPError,))
        assert series["metric"] == {
            "__name__": steps, "job": "unicron-executor", "instance": f"127.0.0.1:{server.port}",
            "job_id": "job-1",
        }  # fmt: skip
        assert series["value"][1] == "2.5"
        rules = httpx.get(f"{url}/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert {r["name"] for g in rules for r in g["rules"]} == set(_alerts())
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        server.close()
