"""Server-sent events of a streamed Responses API request (``"stream": true``).

Event order (OpenAI API reference, "Streaming events"); every event carries ``type`` and
a ``sequence_number`` counting from 0, and is sent as ``event: <type>`` + ``data: <json>``:

1. ``response.created``, ``response.in_progress`` (the response, status in_progress);
2. with ``--reasoning-parser``, for the reasoning: ``response.output_item.added`` (a
   reasoning item), ``response.content_part.added`` (a ``reasoning_text`` part),
   ``response.reasoning_text.delta`` ..., ``response.reasoning_text.done``,
   ``response.content_part.done``, ``response.output_item.done``;
3. per text output: ``response.output_item.added`` (a message item),
   ``response.content_part.added``, ``response.output_text.delta`` ...,
   ``response.output_text.done``, ``response.content_part.done``,
   ``response.output_item.done``;
4. per tool call: ``response.output_item.added`` (a function_call item, arguments ""),
   ``response.function_call_arguments.delta`` ..., ``response.function_call_arguments.done``,
   ``response.output_item.done``;
5. ``response.completed`` (or ``response.incomplete`` when the token budget ended the
   output) with the whole response, usage included.

An error after the 200 header is sent as an ``error`` event. The deltas concatenate to
the text and arguments of the final output items; the reasoning parser splits the
reasoning off first (`ReasoningParser.stream`); with tools the rest is split into
message text and calls by the request's tool-call parser (`ToolParser.stream`: text that
may begin call markup is held back, markup never reaches the message). A call the token
budget cut after its first fragment was sent stays, marked ``incomplete``; the
non-streamed output drops it.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from radixlm.frontend.reasoning import ReasoningParser
from radixlm.frontend.responses_output import (
    call_item,
    item_id,
    message_item,
    reasoning_item,
    reasoning_part,
    text_part,
)
from radixlm.frontend.tool_parsers import ToolParser

_encoder = msgspec.json.Encoder()


class ResponseEvents:
    """Builds the event stream of one response; `items` are its output items so far
    (the final output once `finish` ran).

    Args:
        parser: the tool-call parser of the output (None: no tools, all text is message).
        reasoning: the reasoning parser (None: no reasoning is split off).
    """

    def __init__(self, parser: ToolParser | None, reasoning: ReasoningParser | None = None):
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        self._calls = parser.stream() if parser is not None else None
        self._reasoning = reasoning.stream() if reasoning is not None else None
        self._thought: dict[str, Any] | None = None  # the open reasoning item
        self._thought_text = ""
        self._message: dict[str, Any] | None = None  # the open message item
        self._text = ""  # its text so far
        self._call: dict[str, Any] | None = None  # the open function_call item

    def event(self, kind: str, **fields: Any) -> bytes:
        """One SSE event of type `kind` with the next sequence number."""
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + _encoder.encode(data) + b"\n\n"

    def opening(self, response: dict[str, Any]) -> list[bytes]:
        return [
            self.event("response.created", response=response),
            self.event("response.in_progress", response=response),
        ]

    def feed(self, delta: str, final: bool, status: str) -> list[bytes]:
        """Events for a text delta of the generation (`final`: its last one, `status` then
        ``incomplete`` when the token budget cut it). Text that may begin call markup is
        held back until it is known; a cut call's markup never reaches the message."""
        out = []
        if self._reasoning is not None:
            split = self._reasoning.feed(delta, final)
            out += self._reason(split.reasoning)
            delta = split.content
            if delta:
                out += self._close_thought("completed")
        if self._calls is None:
            content, frags = delta, []
        else:
            d = self._calls.feed(delta)
            content, frags = d.content, list(d.calls)
            if final:
                end = self._calls.finish(cut=status == "incomplete")
                content, frags = content + end.content, frags + end.calls
        if content:
            if self._message is None:
                out += self._open_message()
            self._text += content
            out.append(self.event("response.output_text.delta", **self._where(), delta=content))
        for frag in frags:
            if frag.id is not None:  # a new call: earlier items are complete
                out += self._close_message("completed") + self._close_call()
                self._call = call_item(item_id("fc"), frag.id, frag.name, "", "in_progress")
                self.items.append(self._call)
                out.append(self._item_event("response.output_item.added", self._call))
            piece = frag.arguments
            if not piece:
                continue
            self._call["arguments"] += piece
            out.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=self._call["id"],
                    output_index=len(self.items) - 1,
                    delta=piece,
                )
            )
        return out

    def finish(self, status: str) -> list[bytes]:
        """Close the open items (`status`: completed / incomplete); a response with no
        output gets one empty message, as the non-streamed output has."""
        out = self._close_thought(status)
        if not self.items:
            out += self._open_message()
        return out + self._close_message(status) + self._close_call()

    def closing(self, response: dict[str, Any]) -> bytes:
        """The last event: response.completed, or response.incomplete."""
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return self.event(kind, response=response)

    # ---- items ------------------------------------------------------------------------

    def _reason(self, piece: str) -> list[bytes]:
        """Events for a reasoning piece (the reasoning item opened on the first)."""
        if not piece:
            return []
        out = []
        if self._thought is None:
            self._thought = reasoning_item(item_id("rs"), None, "in_progress")
            self.items.append(self._thought)
            out.append(self._item_event("response.output_item.added", self._thought))
            where = self._thought_where()
            out.append(self.event("response.content_part.added", **where, part=reasoning_part("")))
        self._thought_text += piece
        where = self._thought_where()
        out.append(self.event("response.reasoning_text.delta", **where, delta=piece))
        return out

    def _thought_where(self) -> dict[str, Any]:
        return {
            "item_id": self._thought["id"],
            "output_index": self.items.index(self._thought),
            "content_index": 0,
        }

    def _close_thought(self, status: str) -> list[bytes]:
        if self._thought is None or self._thought["status"] != "in_progress":
            return []
        where, text = self._thought_where(), self._thought_text
        done = self.event("response.reasoning_text.done", **where, text=text)
        part_done = self.event("response.content_part.done", **where, part=reasoning_part(text))
        self._thought.update(status=status, content=[reasoning_part(text)])
        return [done, part_done, self._item_event("response.output_item.done", self._thought)]

    def _where(self) -> dict[str, Any]:
        return {
            "item_id": self._message["id"],
            "output_index": len(self.items) - 1,
            "content_index": 0,
            "logprobs": [],
        }

    def _item_event(self, kind: str, item: dict[str, Any]) -> bytes:
        return self.event(kind, output_index=self.items.index(item), item=item)

    def _open_message(self) -> list[bytes]:
        self._message = message_item(item_id("msg"), None, "in_progress")
        self.items.append(self._message)
        added = self._item_event("response.output_item.added", self._message)
        where = {k: v for k, v in self._where().items() if k != "logprobs"}
        return [added, self.event("response.content_part.added", **where, part=text_part(""))]

    def _close_message(self, status: str) -> list[bytes]:
        if self._message is None:
            return []
        where = self._where()
        part = text_part(self._text)
        done = self.event("response.output_text.done", **where, text=self._text)
        where.pop("logprobs")
        part_done = self.event("response.content_part.done", **where, part=part)
        self._message.update(status=status, content=[part])
        item_done = self._item_event("response.output_item.done", self._message)
        self._message = None
        return [done, part_done, item_done]

    def _close_call(self) -> list[bytes]:
        if self._call is None:
            return []
        call = self._call
        # A call the token budget cut stays as sent (fragments cannot be taken back),
        # marked incomplete: its arguments are not a whole JSON value.
        call["status"] = "completed" if _is_json(call["arguments"]) else "incomplete"
        index = self.items.index(call)
        done = self.event(
            "response.function_call_arguments.done",
            item_id=call["id"],
            output_index=index,
            name=call["name"],
            arguments=call["arguments"],
        )
        self._call = None
        return [done, self._item_event("response.output_item.done", call)]


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
