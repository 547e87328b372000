"""botocore client settings shared by the handlers and the gateway: connection pools sized to the
concurrency a client serves.

On AWS one Lambda execution environment serves one invocation at a time, so botocore's default
pool (10 connections) is plenty. The local stack runs every handler of a Map in one process, all
sharing one client per service (`stepwise.handlers._common.store`): at 64 rollouts in flight a
10-connection pool opens a new connection for most requests and drops it after ("Connection pool
is full, discarding connection"), and the local server starts a thread per connection. The local
runner sets ``STEPWISE_MAX_POOL_CONNECTIONS`` to the concurrency it will drive.
"""

from __future__ import annotations

import os
from typing import Any

from botocore.config import Config

#: Environment variable: connections kept per client and host (default botocore's 10).
ENV_MAX_POOL_CONNECTIONS = "STEPWISE_MAX_POOL_CONNECTIONS"
DEFAULT_MAX_POOL_CONNECTIONS = 10


def max_pool_connections() -> int:
    """``STEPWISE_MAX_POOL_CONNECTIONS`` (an integer >= 1), else 10."""
    return max(1, int(os.environ.get(ENV_MAX_POOL_CONNECTIONS) or DEFAULT_MAX_POOL_CONNECTIONS))


def client_config(**settings: Any) -> Config:
    """A botocore ``Config`` with ``max_pool_connections`` from the environment plus ``settings``
    (e.g. ``retries``); a ``max_pool_connections`` in ``settings`` wins."""
    return Config(**{"max_pool_connections": max_pool_connections(), **settings})
