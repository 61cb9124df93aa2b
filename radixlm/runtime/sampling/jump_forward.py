"""Jump-forward decoding: append the text a grammar forces without a decode step per token.

When a constrained request's grammar allows exactly one continuation string (xgrammar's
``GrammarMatcher.find_jump_forward_string``: a fixed JSON key, the rest of an enum
value once it is unambiguous, a regex literal), that string is appended at once as
tokens and the model computes their KV in one extend step (the compressed finite-state
machine of Zheng et al. 2024, "SGLang: Efficient Execution of Structured Language Model
Programs", section 4).

Tokens. The string is tokenized together with the text of the token sampled just before
it, because a BPE tokenizer may merge across that boundary (``{`` + ``"name": "``
encodes as ``{"``, ``name``, ...); when the merge changes the sampled token, that token
(not yet streamed nor in the KV) is replaced. The last token of the encoding is left to
the model when it is a strict prefix of a longer vocabulary token, so a token that the
model would extend into the free text after the string is not forced (xgrammar's rule in
``find_jump_forward_tokens``). Every token is accepted by the matcher; if one is
rejected the jump is undone and the request decodes normally.

Exactness. The appended tokens are the tokenizer's own encoding of the forced text; a
model decoding token by token under the grammar mask may spell the same text with other
tokens (``{`` then ``"`` instead of ``{"``). The text is always valid for the grammar,
but the tokens, and the free text the model writes after them, can differ from ordinary
constrained decoding: jump-forward is therefore opt-in (``--enable-jump-forward``,
docs/serving.md).
"""

from __future__ import annotations

from typing import Any


class JumpForward:
    """Finds and accepts the tokens of a grammar's forced continuation.

    Args:
        tokenizer: the model's Hugging Face tokenizer (encodes the forced text; its
            vocabulary gives the strict-prefix set, built on first use).

    Attributes:
        jumps: jumps made so far. tokens: tokens they appended (replacements included).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._prefixes: frozenset[str] | None = None
        self.jumps = 0
        self.tokens = 0

    def continuation(
        self, matcher: Any, last_token: int | None, room: int
    ) -> tuple[bool, list[int]]:
        """Advance `matcher` over the forced continuation after its accepted tokens.

        Args:
            matcher: the request's `xgrammar.GrammarMatcher`, which has accepted
                `last_token` last (when it is not None).
            last_token: the token sampled this step, not yet streamed nor in the KV; None
                when there is none to merge with.
            room: tokens the request may still append after `last_token` (its
                max_new_tokens and context limits); the jump is cut to fit.

        Returns ``(replace_last, ids)``: the tokens to append (the matcher has accepted
        them), after removing `last_token` from the output when `replace_last` (the
        matcher no longer holds it either). ``(False, [])`` when nothing is forced, the
        forced text cannot be tokenized so that the matcher accepts it, or it would not
        add text.
        """
        forced = matcher.find_jump_forward_string() if room > 0 else ""
        if not forced:
            return False, []
        replace, ids = self._encode(forced, last_token)
        ids = self._trim(ids)[: room + int(replace)]
        if replace and len(self.tokenizer.decode(ids)) <= len(self.tokenizer.decode([last_token])):
            return False, []  # the re-spelled token alone: nothing forced is appended
        if not ids:
            return False, []
        if replace:
            matcher.rollback(1)
        accepted = 0
        for tok in ids:
            if not matcher.accept_token(tok):
                break
            accepted += 1
        if accepted < len(ids):  # undo: the request decodes this stretch normally
            if accepted:
                matcher.rollback(accepted)
            if replace:
                matcher.accept_token(last_token)
            return False, []
        self.jumps += 1
        self.tokens += len(ids)
        return replace, ids

    def _encode(self, forced: str, last_token: int | None) -> tuple[bool, list[int]]:
        """Token ids of `forced`, merged with `last_token`'s text where the tokenizer
        merges them: ``(True, ids)`` when `ids` re-spell that token too."""
        tok = self.tokenizer
        if last_token is not None:
            head = tok.decode([last_token])
            if head and "\ufffd" not in head:  # a whole character: safe to re-encode
                text = head + forced
                ids = tok.encode(text, add_special_tokens=False)
                if ids and tok.decode(ids) == text:
                    if ids[0] == last_token:
                        return False, ids[1:]
                    return True, ids
        ids = tok.encode(forced, add_special_tokens=False)
        return False, ids if tok.decode(ids) == forced else []

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
