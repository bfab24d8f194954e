import pytest

from controlplane.sweeps.storage import close_connections


@pytest.fixture(autouse=True)
def _optuna_connections_closed():
    """Optuna's pooled connections closed after each test, so the test database can go."""
    yield
    close_connections()
