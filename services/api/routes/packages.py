"""Packages: upload a job's working directory as a tar.gz (``unicron submit --working-dir``).

``POST /v1/packages`` takes the archive as the raw body, with its sha256 in ``?sha256=``. The
API refuses a body over ``MAX_PACKAGE_BYTES`` (413, read no further), one whose sha256 is not
the one given (422) and one that is not a gzip stream (422), and stores the rest in the
JetStream object store under the sha256 (:mod:`unicron.shared.bus.packages`). Uploading the same
bytes again is a no-op (200 instead of 201). A job then names it as ``working_dir: pkg://<sha256>``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from unicron.services.api.access import Principal
from unicron.services.api.deps import BusDep
from unicron.services.api.errors import errors
from unicron.shared.bus.packages import MAX_PACKAGE_BYTES
from unicron.shared.contracts.jobspec import PACKAGE_SCHEME, PackageStored
from unicron.shared.logging import get_logger

router = APIRouter(prefix="/v1/packages", tags=["packages"])
log = get_logger(component="api.packages")
_GZIP_MAGIC = b"\x1f\x8b"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _too_large() -> HTTPException:
    return HTTPException(
        status.HTTP_413_CONTENT_TOO_LARGE,
        f"package is over the limit of {MAX_PACKAGE_BYTES // (1024 * 1024)} MiB",
    )


async def _read_bounded(request: Request) -> bytes:
    """The body, refused as soon as it passes the limit (a declared length is checked first)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_PACKAGE_BYTES:
        raise _too_large()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_PACKAGE_BYTES:
            raise _too_large()
        chunks.append(chunk)
    return b"".join(chunks)


# The route reads the raw body itself (to stop at the limit), so FastAPI cannot infer it.
ARCHIVE_BODY = {
    "required": True,
    "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=PackageStored,
    responses={
        200: {"model": PackageStored, "description": "the same bytes were stored before"},
        **errors(413, 422),
    },
    openapi_extra={"requestBody": ARCHIVE_BODY},
)
async def upload_package(
    request: Request,
    response: Response,
    bus: BusDep,
    caller: Principal,
    sha256: Annotated[str, Query(description="sha256 of the body, 64 lowercase hex")],
) -> PackageStored:
    """Store a tar.gz under its sha256; the same bytes again are a no-op (200)."""
    if not _SHA256.match(sha256):
        raise HTTPException(422, "sha256 must be 64 lowercase hex digits")
    data = await _read_bounded(request)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise HTTPException(422, "the body's sha256 is not the one given: upload corrupted?")
    if not data.startswith(_GZIP_MAGIC):
        raise HTTPException(422, "a package must be a tar.gz archive")
    stored, created = await bus.put_package(data)
    if not created:
        response.status_code = status.HTTP_200_OK
    log.info("package stored", sha256=stored, size=len(data), new=created, tenant=caller.tenant)
    return PackageStored(sha256=stored, size=len(data), working_dir=PACKAGE_SCHEME + stored)
