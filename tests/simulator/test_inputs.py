"""Bad input files are rejected with the file, line and field named."""

from __future__ import annotations

from pathlib import Path

import pytest
from unicron.planning.api import TransitionKind
from unicron.simulator.inputs import (
    ClusterConfig,
    InputError,
    load_calibration,
    load_cluster,
    load_jobs,
)
from unicron.simulator.trace import load_trace

from tests.simulator.conftest import write

CLUSTER = ClusterConfig(4, 8, "a100")


def test_cluster_json_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "c.json", '{\n  "nodes": 4,\n  "gpus_per_node": 8,,\n}')
    with pytest.raises(InputError, match=r"c\.json:3: not valid JSON"):
        load_cluster(path)


def test_cluster_bad_field_and_unknown_gpu(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r":2: nodes: expected a number"):
        load_cluster(write(tmp_path / "c.json", '{\n "nodes": "many"\n}'))
    with pytest.raises(InputError, match=r":3: .*unknown cluster preset 'tpu'"):
        load_cluster(write(tmp_path / "d.json", '{\n "nodes": 2,\n "gpu": "TPU"\n}'))


def test_job_bad_field_names_its_line(tmp_path: Path) -> None:
    text = (
        "[\n"
        ' {"name": "a", "params_b": 1.3, "weight": 1, "min_gpus": 8, "max_gpus": 16},\n'
        ' {"name": "b", "params_b": 1.3, "weight": 1,\n'
        '  "min_gpus": 12, "max_gpus": 16}\n'
        "]"
    )
    with pytest.raises(InputError, match=r"jobs\.json:4: job 'b': min_gpus must be a multiple"):
        load_jobs(write(tmp_path / "jobs.json", text), CLUSTER)


def test_job_missing_field_and_duplicate(tmp_path: Path) -> None:
    missing = '[\n {"name": "a", "weight": 1, "min_gpus": 8, "max_gpus": 8}\n]'
    with pytest.raises(InputError, match=r":2: job 'a': missing field 'params_b'"):
        load_jobs(write(tmp_path / "j.json", missing), CLUSTER)
    row = '{"name": "a", "params_b": 1, "weight": 1, "min_gpus": 8, "max_gpus": 8}'
    with pytest.raises(InputError, match=r":3: name: 'a' twice"):
        load_jobs(write(tmp_path / "k.json", f"[\n {row},\n {row}\n]"), CLUSTER)


def test_trace_bad_rows_name_line_and_field(tmp_path: Path) -> None:
    head = "time_s,node,category,repair_s\n"
    bad_category = write(tmp_path / "t.csv", head + "10,0,ecc,60\n20,1,cosmic_ray,0\n")
    with pytest.raises(InputError, match=r"t\.csv:3: category: 'cosmic_ray'"):
        load_trace(bad_category, 4)
    bad_node = write(tmp_path / "u.csv", head + "10,7,ecc,60\n")
    with pytest.raises(InputError, match=r"u\.csv:2: node: '7'.*not in the cluster"):
        load_trace(bad_node, 4)
    bad_time = write(tmp_path / "v.csv", head + "soon,1,ecc,60\n")
    with pytest.raises(InputError, match=r"v\.csv:2: time_s"):
        load_trace(bad_time, 4)
    with pytest.raises(InputError, match=r"w\.csv:1: header .*missing repair_s"):
        load_trace(write(tmp_path / "w.csv", "time_s,node,category\n1,0,ecc\n"), 4)


def test_good_trace_sorted_with_names(tmp_path: Path) -> None:
    text = "time_s,node,category,repair_s\n50,node-00002,task_hang,0\n10,1,ecc,3600\n"
    failures = load_trace(write(tmp_path / "t.csv", text), 4)
    assert [(f.time_s, f.node, f.category.value) for f in failures] == [
        (10.0, 1, "ecc"),
        (50.0, 2, "task_hang"),
    ]


def test_calibration_file_errors_name_line_and_field(tmp_path: Path) -> None:
    unknown_kind = '{\n "transition_factors": {\n  "restart": 1.2,\n  "teleport": 2\n }\n}'
    with pytest.raises(InputError, match=r"k\.json:4: transition_factors\.teleport: not a"):
        load_calibration(write(tmp_path / "k.json", unknown_kind))
    negative = '{\n "transition_factors": {"restart": -1}\n}'
    with pytest.raises(InputError, match=r"n\.json:2: transition_factors\.restart: .*greater"):
        load_calibration(write(tmp_path / "n.json", negative))
    typo = '{\n "transition_factors": {},\n "failure_rate": 1e-3\n}'
    with pytest.raises(InputError, match=r"t\.json:3: failure_rate: Extra inputs"):
        load_calibration(write(tmp_path / "t.json", typo))


def test_a_hand_written_calibration_needs_only_what_it_sets(tmp_path: Path) -> None:
    text = '{"transition_factors": {"restart": 1.3}, "failure_rate_per_gpu_h": 2e-5}'
    calibration = load_calibration(write(tmp_path / "c.json", text))
    assert calibration.transition_factors == ((TransitionKind.RESTART, 1.3),)
    assert calibration.failure_rate_per_gpu_h == 2e-5
