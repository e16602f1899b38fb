# The fake-upstream fixture is shared with the gateway tests, not copied.
from tests.gateway.conftest import upstreams  # noqa: F401
