"""The real ledger (scripted engine, SQLite) for the client tests that drive it."""

from collections.abc import Iterator

import pytest
from openai import OpenAI

from tests.e2e.conftest import engine, ledger  # noqa: F401
from tests.support.server import RunningServer


@pytest.fixture
def client(ledger: RunningServer) -> Iterator[OpenAI]:  # noqa: F811
    """Like tests/e2e's, but closed afterwards (an unclosed pool is a ResourceWarning later)."""
    with OpenAI(
        base_url=ledger.base_url + "/v1", api_key="test-key", max_retries=0, timeout=60
    ) as c:
        yield c
