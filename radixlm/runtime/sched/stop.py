"""Stop conditions of a request: EOS / stop token ids, stop strings, length, context."""

from __future__ import annotations

from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.sched.request import Req


def decode_text(
    tokenizer, ids: list[int], skip_special_tokens: bool = True, spaces_between: bool = True
) -> str:
    """`ids` as output text, special tokens left out or written (`skip_special_tokens`);
    `spaces_between` is ``spaces_between_special_tokens``, which only slow (Python)
    tokenizers read. The scheduler's stop-string check decodes with the same settings,
    so a matched stop string is found again in the text it cuts."""
    if spaces_between:
        return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    return tokenizer.decode(
        ids, skip_special_tokens=skip_special_tokens, spaces_between_special_tokens=False
    )


class StopChecker:
    """Decides after each new token whether a request is done.

    Args:
        eos_token_ids: token ids that end generation unless `ignore_eos`.
        context_len: tokens per request at most (prompt + output).
        tokenizer: decodes output tails for stop strings (requests with `stop` need it).
    """

    def __init__(self, eos_token_ids, context_len: int, tokenizer=None):
        self.eos_token_ids = set(eos_token_ids)
        self.context_len = context_len
        self.tokenizer = tokenizer

    def check(self, req: Req, tok: int) -> FinishReason | None:
        """Finish reason (STOP or LENGTH) after `tok` was appended, else None; sets
        `req.matched_stop` for a stop token or string."""
        p = req.params
        if len(req.output_ids) < p.min_new_tokens:  # only length and context end it early
            return self._length(req)
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_token_ids):
            req.matched_stop = tok
            return FinishReason.STOP
        if p.stop and self.matched_stop_str(req) is not None:
            return FinishReason.STOP
        return self._length(req)

    def _length(self, req: Req) -> FinishReason | None:
        if len(req.output_ids) >= req.params.max_new_tokens or req.kv_len + 1 >= self.context_len:
            return FinishReason.LENGTH
        return None

    def matched_stop_str(self, req: Req) -> str | None:
        """The first stop string ending in the output's decoded tail, recorded in
        `req.matched_stop`. Every token holds at least one byte, so the last
        len(utf-8 bytes of stop)+1 tokens cover any occurrence the newest token completed.
        The tail is decoded as the detokenizer decodes the text (special tokens skipped or
        written per request), so the stop string it cuts is the one found here."""
        p = req.params
        window = max(len(s.encode("utf-8")) for s in p.stop) + 1
        tail = decode_text(
            self.tokenizer,
            req.output_ids[-window:],
            p.skip_special_tokens,
            p.spaces_between_special_tokens,
        )
        for s in req.params.stop:
            if s in tail:
                req.matched_stop = s
                return s
        return None
