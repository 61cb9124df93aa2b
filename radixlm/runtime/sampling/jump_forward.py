"""Jump-forward decoding: draft the text a grammar forces and verify it in one forward.

When a constrained request's grammar allows exactly one continuation string (xgrammar's
``GrammarMatcher.find_jump_forward_string``: a fixed JSON key, the rest of an enum
value once it is unambiguous, a regex literal), that string need not be decoded one
forward per token (the compressed finite-state machine of Zheng et al. 2024, "SGLang:
Efficient Execution of Structured Language Model Programs", section 4).

Tokens. SGLang appends the tokenizer's encoding of the string. But a model decoding
under the grammar mask often spells the same text with other tokens (SmolLM2-135M writes
``{`` ``"`` ``f`` ``ul`` ``l`` where its tokenizer writes ``{"`` ``full``), and the free
text it writes afterwards is conditioned on the spelling, so appended tokens change the
output. Here the encoding is a *draft*: the request computes it in one extend row, and
each position's token is chosen exactly as decoding would choose it (grammar mask, then
the request's own sampler and draw); drafted tokens are kept while they agree, and the
first chosen token that differs ends the step (`runtime/sched/jump.py`). The output is
therefore the output of ordinary constrained decoding, in fewer forwards wherever the
model spells the forced text as the tokenizer does.

Boundary. The string is encoded together with the text of the token sampled just before
it, since a BPE tokenizer may merge across that boundary; the draft is the part after
that token when the merge keeps it, else the string encoded alone. The last token of the
encoding is dropped when it is a strict prefix of a longer vocabulary token (it may be
extended by the free text after the string; xgrammar's rule in
``find_jump_forward_tokens``).
"""

from __future__ import annotations

from typing import Any


def accepted_prefix(matcher: Any, ids: list[int]) -> int:
    """How many of `ids`, in order, the `xgrammar.GrammarMatcher` accepts from its
    current state (it stops at the first rejected token). Leaves the matcher unchanged."""
    accepted = 0
    for tok in ids:
        if not matcher.accept_token(tok):
            break
        accepted += 1
    if accepted:
        matcher.rollback(accepted)
    return accepted


class JumpForward:
    """Drafts a grammar's forced continuation as tokens.

    Args:
        tokenizer: the model's Hugging Face tokenizer (encodes the forced text; its
            vocabulary gives the strict-prefix set, built on first use).

    Attributes:
        drafted / accepted: draft tokens proposed, and kept after verification (counted by
            the scheduler's forward step, `runtime/sched/forward_step.py`), so far.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._prefixes: frozenset[str] | None = None
        self.drafted = 0
        self.accepted = 0

    def draft(self, matcher: Any, last_token: int, room: int) -> list[int]:
        """Tokens spelling the continuation forced after `matcher`'s accepted tokens.

        Args:
            matcher: the request's `xgrammar.GrammarMatcher`; it has accepted
                `last_token` last. Left unchanged.
            last_token: the request's newest token.
            room: the most tokens to draft.

        Returns the draft, each token accepted by the grammar in turn; [] when nothing is
        forced or the forced text does not tokenize into tokens the grammar accepts.
        """
        forced = matcher.find_jump_forward_string() if room > 0 else ""
        if not forced:
            return []
        ids = self._trim(self._encode(forced, last_token))[:room]
        if accepted_prefix(matcher, ids) < len(ids):
            return []
        self.drafted += len(ids)
        return ids

    def _encode(self, forced: str, last_token: int) -> list[int]:
        """Token ids of `forced` after `last_token`: the tail of their joint encoding when
        it keeps `last_token`, else `forced` encoded alone ([] if that is not exact)."""
        tok = self.tokenizer
        head = tok.decode([last_token])
        if head and "\ufffd" not in head:  # a whole character: safe to re-encode
            text = head + forced
            ids = tok.encode(text, add_special_tokens=False)
            if ids and ids[0] == last_token and tok.decode(ids) == text:
                return ids[1:]
        ids = tok.encode(forced, add_special_tokens=False)
        return ids if tok.decode(ids) == forced else []

    def _trim(self, ids: list[int]) -> list[int]:
        """`ids` without a last token that is a strict prefix of a longer token. Compared
        on the vocabulary's own token strings (byte-level or sentencepiece symbols), where
        prefixes are prefixes of the tokens' bytes."""
        if ids and self.tokenizer.convert_ids_to_tokens(ids[-1]) in self._strict_prefixes():
            return ids[:-1]
        return ids

    def _strict_prefixes(self) -> frozenset[str]:
        """Every strict prefix of every vocabulary token string (built on first use)."""
        if self._prefixes is None:
            vocab = self.tokenizer.get_vocab()
            self._prefixes = frozenset(t[:k] for t in vocab for k in range(1, len(t)))
        return self._prefixes
