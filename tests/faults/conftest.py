"""Resources for the fault tests: a PostgreSQL cluster of their own (one per session: initdb
and start take a second or two; each test resets its database) and a tiny tmpfs per test
(unmounted afterwards, whatever happened). Both skip with the reason when this machine cannot
provide them (not root, no PostgreSQL binaries, mount not permitted)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.storage import Tmpfs, mount_unavailable
from tests.support.pg_cluster import PgCluster, own_cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    with own_cluster() as cluster:
        yield cluster


@pytest.fixture
def cluster(pg_cluster: PgCluster) -> Iterator[PgCluster]:
    """The session's cluster, running and thawed before and after the test."""
    pg_cluster.thaw()
    if not pg_cluster.running:
        pg_cluster.start()
    try:
        yield pg_cluster
    finally:
        pg_cluster.thaw()
        if not pg_cluster.running:
            pg_cluster.start()


@pytest.fixture
def disk() -> Iterator[Tmpfs]:
    """A 16 MiB tmpfs of the test's own."""
    reason = mount_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with Tmpfs("16m") as tmpfs:
        yield tmpfs
