"""User entrypoint jobs over REST: strict specs, package uploads, and pkg:// jobs."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from typing import Any

import httpx
import pytest
from unicron.shared.store.state import StateStore

SPEC: dict[str, Any] = {"name": "mine", "entrypoint": ["python", "train.py"], "max_workers": 2}


def tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def upload(client: httpx.AsyncClient, data: bytes) -> httpx.Response:
    sha = hashlib.sha256(data).hexdigest()
    return await client.post("/v1/packages", params={"sha256": sha}, content=data)


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("weight", {"weight": 1e7}),
        ("steps", {"steps": True}),
        ("steps", {"steps": "10"}),
        ("entrypoint", {"entrypoint": "python train.py"}),
        ("entrypoint", {"entrypoint": []}),
        ("entrypoint", {"entrypoint": ["python", "a\u0000b"]}),
        ("env", {"env": {"BATCH": 4}}),
        ("env", {"env": {"RANK": "3"}}),
        ("env", {"env": {"UNICRON_JOB_ID": "x"}}),
        ("working_dir", {"working_dir": "relative/dir"}),
        ("working_dir", {"working_dir": "/a/../b"}),
        ("working_dir", {"working_dir": "pkg://not-a-sha"}),
        ("max_restarts", {"max_restarts": -1}),
        ("max_restarts", {"max_restarts": 2.5}),
    ],
)
async def test_bad_specs_are_refused_naming_the_field(
    client: httpx.AsyncClient, state: StateStore, field: str, change: dict[str, Any]
) -> None:
    response = await client.post("/v1/jobs", json={**SPEC, **change})
    assert response.status_code == 422, response.text
    assert field in response.json()["message"]
    assert await state.list_jobs() == []


@pytest.mark.parametrize("weight", [b"1e309", b"Infinity", b"-Infinity", b"NaN"])
async def test_non_finite_weight_is_refused(
    client: httpx.AsyncClient, state: StateStore, weight: bytes
) -> None:
    """1e309 parses as inf (JSON has no inf of its own): once accepted, it broke every listing."""
    body = b'{"name": "w", "weight": ' + weight + b"}"
    headers = {"Content-Type": "application/json"}
    response = await client.post("/v1/jobs", content=body, headers=headers)
    assert response.status_code == 422
    assert "weight" in response.json()["message"]
    assert await state.list_jobs() == []
    assert (await client.get("/v1/jobs")).status_code == 200


async def test_an_entrypoint_job_is_accepted_with_its_defaults(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/jobs", json={**SPEC, "env": {"LR": "0.1"}})
    assert response.status_code == 201, response.text
    spec = response.json()["spec"]
    assert (spec["entrypoint"], spec["env"], spec["max_restarts"]) == (
        ["python", "train.py"],
        {"LR": "0.1"},
        3,
    )
    assert spec["trainer"] == "gpt" and spec["working_dir"] is None


async def test_a_job_of_a_package_not_uploaded_is_refused(
    client: httpx.AsyncClient, state: StateStore
) -> None:
    missing = "pkg://" + "0" * 64
    response = await client.post("/v1/jobs", json={**SPEC, "working_dir": missing})
    assert response.status_code == 422
    assert "was not uploaded" in response.json()["detail"]
    assert await state.list_jobs() == []


async def test_package_upload_is_checked_stored_once_and_usable(
    client: httpx.AsyncClient,
) -> None:
    data = tar_gz({"train.py": b"print('hi')\n"})
    first = await upload(client, data)
    assert first.status_code == 201, first.text
    stored = first.json()
    assert stored["sha256"] == hashlib.sha256(data).hexdigest()
    assert stored["size"] == len(data)
    again = await upload(client, data)
    assert (again.status_code, again.json()) == (200, stored)

    job = await client.post("/v1/jobs", json={**SPEC, "working_dir": stored["working_dir"]})
    assert job.status_code == 201, job.text
    assert job.json()["spec"]["working_dir"] == "pkg://" + stored["sha256"]


async def test_bad_uploads_are_refused(client: httpx.AsyncClient) -> None:
    data = tar_gz({"a.py": b"x"})
    wrong = await client.post("/v1/packages", params={"sha256": "1" * 64}, content=data)
    assert wrong.status_code == 422 and "sha256" in wrong.json()["detail"]
    plain = await upload(client, b"not a tarball")
    assert plain.status_code == 422 and "tar.gz" in plain.json()["detail"]
    bad = await client.post("/v1/packages", params={"sha256": "XYZ"}, content=data)
    assert bad.status_code == 422


async def test_an_upload_over_the_limit_is_refused(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from unicron.services.api.routes import packages

    monkeypatch.setattr(packages, "MAX_PACKAGE_BYTES", 1024)
    data = tar_gz({"big.bin": os.urandom(4096)})
    assert len(data) > 1024
    response = await upload(client, data)
    assert response.status_code == 413
    assert "over the limit" in response.json()["detail"]
