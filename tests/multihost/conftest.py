"""One cluster per test module: each module's job gets hosts no other job touched."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.multihost.cluster import NODES, Cluster, running_cluster
from tests.multihost.netns import unavailable


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = unavailable()
    if why is not None:
        pytest.skip(f"multi-host test needs network namespaces: {why}")
    with running_cluster(NODES, tmp_path_factory.mktemp("multihost")) as running:
        yield running
