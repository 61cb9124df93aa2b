"""Pinned prefixes: radix-cache paths kept out of eviction for sessions and stored responses.

A pin holds one `PrefixCache.lock` on the deepest node of a token sequence already in the
cache (a finished request's prompt + output, inserted by `KVLedger.release`), so the whole
path root..node stays cached (never evicted) until the pin is released; then the path is
ordinary LRU-evictable cache again. Pins are keyed by their owner (``session:<id>`` for a
session, ``response:<id>`` for a stored Responses API response); pinning a key again moves
its lock to the new sequence.

Budget: ``budget`` tokens (``--session-pin-budget``) bound the tokens on pinned nodes
(the union of the pinned paths: two pins sharing a prefix count it once). Past it, the
least recently used pins are released -- never an error. The scheduler may also release
pins early (`release_oldest`) when a request could otherwise never get KV slots.

Accounting: pinned nodes are locked, so the cache counts them in `protected_size`;
`pinned_tokens()` is that part, and the pool invariant reads
free + evictable + (protected - pinned) + pinned + held == total.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from radixlm.radix import PrefixCache, TreeNode

logger = logging.getLogger(__name__)


@dataclass
class Pin:
    """node: the locked deepest node; tokens: the pinned sequence's cached length;
    last_used: `clock()` seconds of the last pin or touch."""

    node: Any
    tokens: int
    last_used: float


class PinTable:
    """The pins on one prefix cache, bounded by `budget` tokens (pinned-path union).

    clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, tree: PrefixCache, budget: int, clock: Callable[[], float] = time.monotonic):
        self.tree = tree
        self.budget = budget
        self.clock = clock
        self._pins: dict[str, Pin] = {}
        self.released_over_budget = 0  # pins released by the budget since start

    def __len__(self) -> int:
        return len(self._pins)

    def __contains__(self, key: str) -> bool:
        return key in self._pins

    def pin(self, key: str, ids: Sequence[int], extra_key: Hashable | None = None) -> int:
        """Pin the cached prefix of `ids` (namespace `extra_key`) under `key`, replacing
        the key's previous pin; then release least recently used pins while the pinned
        union exceeds the budget (this one last). Returns the tokens pinned (0 when none
        of `ids` is cached, e.g. with the radix cache disabled)."""
        match = self.tree.match_prefix(ids, extra_key)
        self.tree.lock(match.last_node)  # before unpinning the old one: the paths overlap
        self.unpin(key)
        self._pins[key] = Pin(match.last_node, len(match.kv_indices), self.clock())
        self._enforce_budget()
        return len(match.kv_indices)

    def unpin(self, key: str) -> bool:
        """Release `key`'s pin (its path becomes evictable unless locked otherwise);
        False when it has none."""
        pin = self._pins.pop(key, None)
        if pin is None:
            return False
        self.tree.unlock(pin.node)
        return True

    def touch(self, key: str) -> None:
        """Mark `key`'s pin as used now (a no-op without one)."""
        pin = self._pins.get(key)
        if pin is not None:
            pin.last_used = self.clock()

    def release_oldest(self) -> str | None:
        """Release the least recently used pin; returns its key (None: no pins)."""
        if not self._pins:
            return None
        key = min(self._pins, key=lambda k: self._pins[k].last_used)
        self.unpin(key)
        return key

    def release_all(self) -> None:
        """Release every pin (before the cache is reset)."""
        for key in list(self._pins):
            self.unpin(key)

    def idle_since(self, key: str) -> float | None:
        """`clock()` seconds of the key's last use, None without a pin."""
        pin = self._pins.get(key)
        return None if pin is None else pin.last_used

    def keys(self) -> list[str]:
        return list(self._pins)

    def pinned_tokens(self) -> int:
        """Tokens on the nodes of every pinned path, each node counted once."""
        seen: set[int] = set()
        total = 0
        for pin in self._pins.values():
            node = pin.node
            while isinstance(node, TreeNode) and not node.is_root and node.id not in seen:
                seen.add(node.id)
                total += len(node.key)
                node = node.parent
        return total

    def _enforce_budget(self) -> None:
        while self._pins and self.pinned_tokens() > self.budget:
            key = self.release_oldest()
            self.released_over_budget += 1
            logger.info("pin budget of %d tokens exceeded: released %s", self.budget, key)
