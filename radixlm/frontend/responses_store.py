"""Stored responses of the Responses API (``store: true``), in memory, bounded.

Each entry is a response body (what GET /v1/responses/{id} returns) and its
conversation: the chat messages of every turn so far (input items of this and earlier
responses chained by ``previous_response_id``, then this response's output as one
assistant turn), without ``instructions``, which OpenAI does not carry over. A
continuation renders that conversation before its new input, so its prompt starts with
the previous prompt and output and that prefix is served from the radix cache.

The store is an LRU of at most `capacity` responses (``--responses-store-size``): storing
or reading an entry makes it the most recent; the least recent one is dropped past the
bound. Entries live only in this HTTP process (lost on restart). `on_drop` is told the
id of each entry the bound drops (the server releases its pinned prefix then).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class StoredResponse:
    """body: the response object (dict); conversation: chat message dicts (ChatMessage
    fields) ending with this response's output turn."""

    body: dict[str, Any]
    conversation: list[dict[str, Any]]


class ResponseStore:
    """An LRU map of response id -> StoredResponse holding at most `capacity` entries;
    `on_drop(id)` is called for each entry dropped, past the bound or by `delete`."""

    def __init__(self, capacity: int, on_drop: Callable[[str], None] | None = None):
        self.capacity = capacity
        self.on_drop = on_drop
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response (now the most recent), or None when unknown or dropped."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        """Drop a stored response; False when it is unknown (or already dropped)."""
        if self._entries.pop(response_id, None) is None:
            return False
        if self.on_drop is not None:
            self.on_drop(response_id)
        return True

    def put(self, response_id: str, entry: StoredResponse) -> None:
        """Store `entry`, dropping the least recently used entries past `capacity`."""
        if self.capacity <= 0:
            return
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            dropped, _ = self._entries.popitem(last=False)
            if self.on_drop is not None:
                self.on_drop(dropped)
