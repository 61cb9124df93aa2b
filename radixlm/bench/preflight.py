"""What `radixlm bench` checks before it sends a request: that the server answers and
accepts the API key, which model it serves, and a local tokenizer for building prompts.

Every failure is a `ValueError` with a one-line message (the `radixlm` command prints it
as `error: ...` and exits with status 2). Nothing is downloaded: tokenizers come from
radixlm model aliases, local files, or the local Hugging Face cache.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from radixlm.bench.backends import error_detail

PROBE_TIMEOUT_S = 10.0
TOKENIZER_HINT = (
    "pass --tokenizer with a local Hugging Face directory, a .gguf file or a radixlm model "
    "alias such as smollm2-135m"
)
NOT_LOCAL = (
    "not a radixlm model alias, a local directory or .gguf file with tokenizer files, or a "
    "Hugging Face name in the local cache (nothing is downloaded)"
)


def _connect_reason(e: Exception) -> str:
    """'Connection refused' rather than '[Errno 111] Connection refused'."""
    return re.sub(r"^\[Errno -?\d+\]\s*", "", str(e)) or type(e).__name__


def probe_models(base_url: str, api_key: str | None) -> list[dict[str, Any]] | None:
    """GET `{base_url}/v1/models`: the served model cards (each has "id", and on radixlm
    and vLLM "root", the model's path), or None when the server has no such route or
    answers something else than an OpenAI model list (any HTTP answer means it is up).

    Raises:
        ValueError: the server cannot be reached (connection refused, timeout after
            PROBE_TIMEOUT_S seconds, bad URL), or it answers 401/403 (the API key).
    """
    url = f"{base_url.rstrip('/')}/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(url, headers=headers, timeout=PROBE_TIMEOUT_S, trust_env=False)
    except (httpx.HTTPError, httpx.InvalidURL) as e:
        raise ValueError(f"cannot reach {base_url}: {_connect_reason(e)}") from None
    if resp.status_code in (401, 403):
        detail = error_detail(resp, limit=200)
        hint = "check --api-key" if api_key else "pass --api-key"
        raise ValueError(
            f"{base_url} refused the request: HTTP {resp.status_code}: {detail} ({hint})"
        )
    if resp.status_code != 200:
        return None
    try:
        data = resp.json().get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return [card for card in data if isinstance(card, dict) and isinstance(card.get("id"), str)]


def served_model(cards: list[dict[str, Any]] | None, base_url: str) -> str:
    """The first model id of `probe_models`' cards. Raises ValueError when there is none
    (no route, not a model list, or an empty one: the user must pass --model)."""
    if not cards:
        raise ValueError(f"no model name in {base_url}/v1/models; pass --model NAME")
    return cards[0]["id"]


def tokenizer_candidates(
    tokenizer: str | None, model: str | None, cards: list[dict[str, Any]] | None
) -> list[str]:
    """Names to try, in order, for the prompt tokenizer: `tokenizer` alone when given;
    else the model name and then the "root" path the server reports for that model (a
    server started with --served-model-name reports its local path there); else
    smollm2-135m (radixlm's bundled model)."""
    if tokenizer:
        return [tokenizer]
    if model is None:
        return ["smollm2-135m"]
    names = [model]
    for card in cards or []:
        root = card.get("root")
        if card["id"] == model and isinstance(root, str) and root and root not in names:
            names.append(root)
    return names


def load_local_tokenizer(name: str):
    """A Hugging Face tokenizer for a radixlm model alias, a .gguf file, a local
    directory, or a hub name whose files are in the local Hugging Face cache (never
    downloaded). Raises ValueError (one line) when `name` is none of these."""
    from transformers import AutoTokenizer

    from radixlm.errors import ModelNotFoundError
    from radixlm.runtime import MODEL_ALIASES, local_hf_dir

    try:
        target: str | Path = local_hf_dir(name)
    except ModelNotFoundError as e:
        if name in MODEL_ALIASES:
            raise ValueError(str(e)) from None
        target = name
    try:
        return AutoTokenizer.from_pretrained(target, local_files_only=True)
    except (OSError, ValueError):
        raise ValueError(f"no local tokenizer {name!r}: {NOT_LOCAL}") from None


def find_tokenizer(names: list[str], explicit: bool):
    """The first of `names` that `load_local_tokenizer` loads. Raises ValueError (one
    line) with each name's reason, telling the user to pass --tokenizer unless the
    names came from it (`explicit`)."""
    reasons = []
    for name in names:
        try:
            return load_local_tokenizer(name)
        except ValueError as e:
            reasons.append(str(e))
    if explicit:
        raise ValueError(f"--tokenizer: {'; '.join(reasons)}")
    raise ValueError(f"{'; '.join(reasons)}; {TOKENIZER_HINT}")
