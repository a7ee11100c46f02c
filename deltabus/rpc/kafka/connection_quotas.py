"""How many connections a Kafka listener holds, in all and per client address (Kafka's
ConnectionQuotas: max.connections, max.connections.per.ip).

Apart from the network processor because the limits are a policy on what it accepts, not part
of moving bytes: the processor asks before it serves a new connection and tells this when one
opens or closes.
"""

from __future__ import annotations

import collections

from deltabus import config as cfg


class ConnectionQuotas:
    """Connections per client address. Not thread-safe: the processor's thread alone calls it."""

    def __init__(self, config: cfg.SocketServerConfig) -> None:
        self._config = config  # read at each check: the limits are the listener's config
        self._per_ip: collections.Counter[str] = collections.Counter()

    def refusal(self, host: str, connections: int) -> str | None:
        """Why a new connection from `host` must be refused, with `connections` open (None: it
        may stay)."""
        limit = self._config.max_connections
        if connections >= limit:
            return f"the listener has {limit} connections, the most (max.connections={limit})"
        limit = self._config.max_connections_per_ip
        if self._per_ip[host] >= limit:
            return (f"{host} has {limit} connections, the most "
                    f"(max.connections.per.ip={limit})")
        return None

    def opened(self, host: str) -> None:
        self._per_ip[host] += 1

    def closed(self, host: str) -> None:
        self._per_ip[host] -= 1
        if not self._per_ip[host]:
            del self._per_ip[host]
