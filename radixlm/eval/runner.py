"""Runs the tasks on each configuration in turn (the baseline first) and scores them:
each configuration's own scores (accuracy, JSON validity, perplexity) and each candidate's
agreement with the baseline (greedy agreement, first divergence, top-k KL, top-1)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixlm.eval import metrics as m
from radixlm.eval.configs import EvalConfig
from radixlm.eval.targets import Target, open_target
from radixlm.eval.tasks import Task

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """Generation settings. Units: tokens; `top_k` alternatives per teacher-forced
    position for the KL estimate (at most 20 over HTTP's OpenAI routes, any over
    ``/generate``)."""

    gen_len: int = 256
    top_k: int = 20
    exact_max_tokens: int = 8
    json_max_tokens: int = 96


@dataclass
class ConfigRun:
    """One configuration's raw outputs per task (see `_collect`), server info, timing,
    or the error that stopped it."""

    config: EvalConfig
    outputs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None


def _greedy(n: int) -> dict[str, Any]:
    return {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}


def _requests(task: Task, ids: list[list[int]], opts: RunOptions) -> list[dict[str, Any]]:
    """The requests of one task (json items twice: constrained, then unconstrained)."""
    if task.kind == "greedy":
        return [{"input_ids": x, "sampling_params": _greedy(opts.gen_len)} for x in ids]
    if task.kind == "teacher":
        return [
            {
                "input_ids": x,
                "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True,
                "logprob_start_len": 0,
                "top_logprobs_num": opts.top_k,
            }
            for x in ids
        ]
    if task.kind == "exact":
        params = {"max_new_tokens": opts.exact_max_tokens, "temperature": 0.0, "stop": ["\n"]}
        return [{"input_ids": x, "sampling_params": params} for x in ids]
    free = {"max_new_tokens": opts.json_max_tokens, "temperature": 0.0}
    constrained = [
        {"input_ids": x, "sampling_params": {**free, "json_schema": json.dumps(it.schema)}}
        for x, it in zip(ids, task.items)
    ]
    return constrained + [{"input_ids": x, "sampling_params": free} for x in ids]


def _collect(task: Task, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per item: greedy ``ids``; teacher ``logprobs`` (tokens 1..) and ``top`` (per
    position [(logprob, id)], best first); exact ``text``; json ``constrained`` and
    ``free`` texts."""
    if task.kind == "greedy":
        return [{"ids": r["output_ids"]} for r in results]
    if task.kind == "teacher":
        out = []
        for r in results:
            meta = r["meta_info"]
            lps = [e[0] for e in meta["input_token_logprobs"][1:]]
            tops = [[(e[0], e[1]) for e in pos] for pos in meta["input_top_logprobs"][1:]]
            out.append({"logprobs": lps, "top": tops})
        return out
    if task.kind == "exact":
        return [{"text": r["text"]} for r in results]
    n = len(task.items)
    return [{"constrained": a["text"], "free": b["text"]} for a, b in zip(results[:n], results[n:])]


def run_config(
    config: EvalConfig,
    tasks: list[Task],
    encode: Callable[[str], list[int]],
    opts: RunOptions,
    opener: Callable[[EvalConfig], Target] = open_target,
) -> ConfigRun:
    """Run every task on `config`'s target, closed afterwards. A target that fails to open
    or to answer leaves `ConfigRun.error` set (its first line) instead of raising."""
    run = ConfigRun(config=config)
    start = time.perf_counter()
    try:
        target = opener(config)
    except Exception as e:  # an engine that refuses the configuration is a result too
        run.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return run
    try:
        run.info = target.info()
        for task in tasks:
            ids = [encode(it.prompt) for it in task.items]
            logger.info("eval %s: task %s (%d items)", config.name, task.name, len(ids))
            run.outputs[task.name] = _collect(task, target.run(_requests(task, ids, opts)))
    except Exception as e:
        run.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        target.close()
        run.seconds = time.perf_counter() - start
    return run


def score(run: ConfigRun, tasks: list[Task]) -> dict[str, float]:
    """The configuration's own scores: ``<task>.accuracy`` (exact), ``<task>.perplexity``
    (teacher, over all its texts' tokens), ``<task>.json_valid_constrained`` /
    ``.json_valid_free`` (json)."""
    out: dict[str, float] = {}
    for task in tasks:
        outs = run.outputs.get(task.name)
        if outs is None:
            continue
        if task.kind == "exact":
            hits = [m.exact_match(o["text"], it.answer) for o, it in zip(outs, task.items)]
            out[f"{task.name}.accuracy"] = m.mean([float(h) for h in hits])
        elif task.kind == "teacher":
            out[f"{task.name}.perplexity"] = m.perplexity([x for o in outs for x in o["logprobs"]])
        elif task.kind == "json":
            for mode in ("constrained", "free"):
                valid = [m.json_valid(o[mode], it.schema) for o, it in zip(outs, task.items)]
                out[f"{task.name}.json_valid_{mode}"] = m.mean([float(v) for v in valid])
    return out


def compare(base: ConfigRun, cand: ConfigRun, tasks: list[Task]) -> dict[str, Any]:
    """A candidate against the baseline: ``summary`` (greedy agreement mean, first
    divergence median, KL mean and max, top-1 agreement; exact-match answers agreeing
    with the baseline's) and ``per_prompt`` lists per task."""
    summary: dict[str, float] = {}
    per_prompt: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        b, c = base.outputs.get(task.name), cand.outputs.get(task.name)
        if b is None or c is None:
            continue
        if task.kind == "greedy":
            rows = []
            for x, y in zip(b, c):
                agree, first = m.greedy_agreement(x["ids"], y["ids"])
                rows.append(
                    {"agreement": agree, "first_divergence": first, "length": len(x["ids"])}
                )
            per_prompt[task.name] = rows
            summary[f"{task.name}.agreement"] = m.mean([r["agreement"] for r in rows])
            summary[f"{task.name}.first_divergence_median"] = m.median(
                [r["first_divergence"] for r in rows]
            )
        elif task.kind == "teacher":
            kls, top1, rows = [], [], []
            for x, y in zip(b, c):
                pos_kl = [m.topk_kl(p, q) for p, q in zip(x["top"], y["top"])]
                pos_top1 = [p[0][1] == q[0][1] for p, q in zip(x["top"], y["top"])]
                rows.append(
                    {"kl_mean": m.mean(pos_kl), "top1": m.mean([float(t) for t in pos_top1])}
                )
                kls += pos_kl
                top1 += pos_top1
            per_prompt[task.name] = rows
            summary[f"{task.name}.kl_mean"] = m.mean(kls)
            summary[f"{task.name}.kl_max"] = max(kls) if kls else float("nan")
            summary[f"{task.name}.top1_agreement"] = m.mean([float(t) for t in top1])
        elif task.kind == "exact":
            same = [x["text"].strip() == y["text"].strip() for x, y in zip(b, c)]
            per_prompt[task.name] = [
                {"baseline": x["text"], "candidate": y["text"], "same": s}
                for x, y, s in zip(b, c, same)
            ]
            summary[f"{task.name}.same_answer"] = m.mean([float(s) for s in same])
    return {"summary": summary, "per_prompt": per_prompt}
