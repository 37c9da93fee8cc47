"""Job packages: a user's working directory as a tar.gz, kept in a JetStream object store.

``unicron submit --working-dir DIR`` packs DIR and uploads it (``POST /v1/packages``); the API
stores it in the bucket ``UNICRON_PACKAGES`` under its sha256, and a job names it as
``working_dir: pkg://<sha256>``. An agent fetches it from the same bucket before it starts a
worker, so code reaches every node without a shared filesystem. The object's name is the
sha256 of its bytes: a package is immutable and an upload of the same bytes is a no-op.
"""

from __future__ import annotations

import hashlib

from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

PACKAGES_BUCKET = "UNICRON_PACKAGES"
MAX_PACKAGE_BYTES = 100 * 1024 * 1024


class PackageError(RuntimeError):
    """A package that is missing, or whose bytes are not those its name promises."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def package_bucket(js: JetStreamContext) -> ObjectStore:
    """The packages' object store, created on first use."""
    try:
        return await js.object_store(PACKAGES_BUCKET)
    except BucketNotFoundError:
        return await js.create_object_store(PACKAGES_BUCKET)


async def has_package(js: JetStreamContext, sha256: str) -> bool:
    bucket = await package_bucket(js)
    try:
        info = await bucket.get_info(sha256)
    except (ObjectNotFoundError, NotFoundError):
        return False
    return not getattr(info, "deleted", False)


async def put_package(js: JetStreamContext, data: bytes) -> tuple[str, bool]:
    """Store ``data`` under its sha256; (sha256, whether it was new)."""
    sha256 = sha256_hex(data)
    if await has_package(js, sha256):
        return sha256, False
    bucket = await package_bucket(js)
    await bucket.put(sha256, data)
    return sha256, True


async def get_package(js: JetStreamContext, sha256: str) -> bytes:
    """The package's bytes, checked against its name; ``PackageError`` when absent or altered."""
    bucket = await package_bucket(js)
    try:
        result = await bucket.get(sha256)
    except (ObjectNotFoundError, NotFoundError):
        raise PackageError(f"package {sha256} is not in the store") from None
    data = result.data or b""
    if sha256_hex(data) != sha256:
        raise PackageError(f"package {sha256} failed its sha256 check")
    return data
