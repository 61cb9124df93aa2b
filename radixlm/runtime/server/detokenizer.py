"""Incremental detokenization that never emits half a UTF-8 character or re-emits text,
and stop-string trimming with hold-back for streams.

Byte-level BPE splits multi-byte characters across tokens; decoding a partial character
yields U+FFFD. The decoder keeps a short window of already-emitted tokens as left context
(so leading spaces and merges decode as in the full text) and holds text back while it
ends in U+FFFD. Each step decodes only the window, so the cost per token stays constant.
"""

from __future__ import annotations

from radixlm.runtime.sched.stop import decode_text


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    The concatenation of every `add` delta plus `flush()` equals
    `tokenizer.decode(all_ids, skip_special_tokens=...)` for byte-level BPE tokenizers.

    Window: ids[prefix_offset:read_offset] were emitted already and serve as context;
    ids[read_offset:] are pending.
    """

    def __init__(
        self,
        tokenizer,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return decode_text(
            self.tokenizer, ids, self.skip_special_tokens, self.spaces_between_special_tokens
        )

    def add(self, new_ids: list[int]) -> str:
        """Append tokens; return the newly complete text (may be empty)."""
        self.ids.extend(new_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return whatever is still held back (call once, when the request finishes)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        emitted = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        if len(text) <= len(emitted) or (text.endswith("\ufffd") and not final):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(emitted) :]


class RequestDetokenizer:
    """One request's text stream: UTF-8-safe incremental decoding plus stop strings.

    While the request runs, text that could be the start of a stop string is held back
    until it is decided; when the scheduler ends the request on a stop string, the text
    is cut before its first occurrence (after it with `no_stop_trim`), and on a stop
    token id (`stop_token_ids`, EOS) that token's text is left out (kept with
    `no_stop_trim`), as SGLang trims a matched stop; `output_ids` keep the token either
    way. The concatenated deltas equal the final text. skip_special_tokens and
    spaces_between_special_tokens: see `decode_text`.
    """

    def __init__(
        self,
        tokenizer,
        stop: list[str] | tuple[str, ...] = (),
        no_stop_trim: bool = False,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ):
        self._incremental = IncrementalDetokenizer(
            tokenizer, skip_special_tokens, spaces_between_special_tokens
        )
        self.stop = [s for s in stop if s]
        self.no_stop_trim = no_stop_trim
        self.text = ""
        self._sent = 0

    def add(self, new_ids: list[int], finished: bool, matched_stop: int | str | None) -> str:
        """Append this step's tokens; return the text that can be sent now.

        finished: the request ended with this step. matched_stop: the stop string (or
        token id) that ended it, if any.
        """
        trim_token = (
            finished
            and not self.no_stop_trim
            and isinstance(matched_stop, int)
            and bool(new_ids)
            and new_ids[-1] == matched_stop
        )
        self.text += self._incremental.add(new_ids[:-1] if trim_token else new_ids)
        if finished:
            self.text += self._incremental.flush()
            if isinstance(matched_stop, str):
                cut = self.text.find(matched_stop)
                if cut >= 0 and self.no_stop_trim:  # keep the stop string, drop what follows
                    cut += len(matched_stop)
                if cut >= 0:
                    self.text = self.text[: max(cut, self._sent)]
            end = len(self.text)
        else:
            end = len(self.text) - self._held_back()
        delta = self.text[self._sent : end]
        self._sent = max(self._sent, end)
        return delta

    def _held_back(self) -> int:
        """Length of the longest text suffix that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best
