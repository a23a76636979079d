"""Which server a request goes to: sticky per trajectory, least-loaded for a new one.

Every turn of a multi-turn trajectory re-sends its whole context (prompt, sampled tokens, tool output); on the
server that holds its earlier turns most of that context is a prefix-cache hit instead of a new prefill. So a
trajectory's requests go to the server its first request went to (AReaL keeps `rid` on one server, SGLang's router
does the same with its cache-aware policy), as long as that server is up and holds the current weights; a new
trajectory, or one whose server is gone, goes to the server with the fewest requests in flight (ties: fewest
trajectories held, then the first in order). The router holds no lock: the client calls it from its event loop.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


class Router:
    """Trajectory key -> server name, and requests in flight per server."""

    def __init__(self) -> None:
        self.home: dict[str, str] = {}
        self.in_flight: Counter[str] = Counter()
        self._held: Counter[str] = Counter()

    def choose(self, key: str, available: Sequence[str]) -> str:
        """The server for `key`'s next request among `available` (in a fixed order); raises when none is."""
        if not available:
            raise LookupError("no server is available")
        home = self.home.get(key)
        if home is not None and home in available:
            return home
        best = min(available, key=lambda s: (self.in_flight[s], self._held[s], available.index(s)))
        self._move(key, best)
        return best

    def started(self, server: str) -> None:
        self.in_flight[server] += 1

    def ended(self, server: str) -> None:
        self.in_flight[server] -= 1
        if self.in_flight[server] <= 0:
            del self.in_flight[server]

    def forget(self, key: str) -> None:
        """The trajectory ended: its server no longer counts it."""
        home = self.home.pop(key, None)
        if home is not None:
            self._held[home] -= 1

    def _move(self, key: str, server: str) -> None:
        self.forget(key)
        self.home[key] = server
        self._held[server] += 1
