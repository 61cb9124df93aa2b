"""In-process engine harness: plays token-id workloads on one engine and times each request.

Run as a subprocess by `compare_engines.py` (one process per engine and repetition, so
every engine starts cold, with its own thread setting, in its own virtual environment):

    PYTHON engine_harness.py --engine radixlm|radixlm-nomix|transformers|openvino|... \\
        --model-dir DIR --threads T --spec spec.json --out result.json

DIR is the fp32 safetensors directory for radixlm and transformers, the exported model
directory for OpenVINO GenAI (optimum-cli IR) and onnxruntime-genai (model builder).

spec.json: {"workloads": [{"name": str, "sessions": [{"turns": [[ids, out_len], ...],
"resend_history": bool}, ...]}, ...], "max_total_tokens": int, "max_batch": int}.
All sessions of a workload arrive at time 0; a session's turn k+1 is submitted when its
turn k finishes, with prompt = turn k prompt + re-encoded answer text + turn k+1 ids (the
same rule the HTTP path uses). Every request is greedy with EOS ignored, so each engine
produces exactly out_len tokens.

Per request it records, relative to the workload start (seconds): start (submission),
ttft (start -> first token), e2e (start -> last token), itl (gaps between tokens), and
prompt / output / cached tokens (cached: None when the engine does not report it).
This file imports nothing from radixlm at module level (peers run it in their own venv).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any


class Timer:
    """Token arrival times of one request (perf_counter seconds)."""

    def __init__(self, t0: float, prompt_ids: list[int], session: int, turn: int):
        self.t0, self.prompt_ids, self.session, self.turn = t0, prompt_ids, session, turn
        self.start = time.perf_counter()
        self.times: list[float] = []
        self.output_ids: list[int] = []
        self.cached: int | None = None

    def tokens(self, ids: list[int]) -> None:
        now = time.perf_counter()
        self.times.extend([now] * len(ids))
        self.output_ids.extend(ids)

    def result(self) -> dict[str, Any]:
        t = self.times
        return {
            "session": self.session,
            "turn": self.turn,
            "start": self.start - self.t0,
            "ttft": t[0] - self.start if t else 0.0,
            "e2e": t[-1] - self.start if t else 0.0,
            "itl": [b - a for a, b in zip(t, t[1:])],
            "prompt_tokens": len(self.prompt_ids),
            "output_tokens": len(self.output_ids),
            "cached_tokens": self.cached,
        }


def next_prompt(tok, prev_prompt: list[int], answer_ids: list[int], turn_ids: list[int]):
    """History rule shared with the HTTP path: prompt + encode(decode(answer)) + turn."""
    answer = tok.encode(tok.decode(answer_ids, skip_special_tokens=True), add_special_tokens=False)
    return prev_prompt + answer + turn_ids


def next_turn(tok, sessions: list[dict[str, Any]], timer: Timer, t0: float):
    """(Timer, out_len) of the session's turn after the one `timer` finished, or None."""
    s, k = sessions[timer.session], timer.turn + 1
    if k >= len(s["turns"]):
        return None
    ids, n = s["turns"][k]
    if s.get("resend_history"):
        ids = next_prompt(tok, timer.prompt_ids, timer.output_ids, ids)
    return Timer(t0, ids, timer.session, k), n


class RadixlmAdapter:
    """radixlm.Engine driven step by step (`add_request` / `step`), as the OpenVINO
    adapter drives its pipeline: after every step each request's new tokens are stamped,
    and the turns that follow the requests finished in it are all added before the next
    step (so they are prefilled together)."""

    #: Engine settings beyond the model, threads and KV pool size.
    options: dict[str, Any] = {}

    def __init__(self, model_dir: str, threads: int, spec: dict[str, Any]):
        import radixlm

        self.engine = radixlm.Engine(
            model=model_dir,
            num_threads=threads,
            max_total_tokens=spec["max_total_tokens"],
            **self.options,
        )
        self.tok = self.engine.tokenizer

    def run(self, sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        done: list[dict[str, Any]] = []
        live: dict[str, Timer] = {}

        def submit(timer: Timer, out_len: int) -> None:
            params = {"max_new_tokens": out_len, "temperature": 0, "ignore_eos": True}
            rid = self.engine.add_request(input_ids=timer.prompt_ids, sampling_params=params)
            live[rid] = timer

        for i, s in enumerate(sessions):
            submit(Timer(t0, s["turns"][0][0], i, 0), s["turns"][0][1])
        while live:
            for chunk in self.engine.step():
                timer = live[chunk["rid"]]
                timer.tokens(chunk["output_ids"])
                if chunk.get("finish_reason") is None:
                    continue
                del live[chunk["rid"]]
                timer.cached = chunk["usage"]["cached_tokens"]
                done.append(timer.result())
                nxt = next_turn(self.tok, sessions, timer, t0)
                if nxt is not None:
                    submit(*nxt)
        return done

    def close(self) -> None:
        self.engine.shutdown()


class RadixlmKv16Adapter(RadixlmAdapter):
    """radixlm.Engine with a float16 KV cache (--kv-cache-dtype float16)."""

    options = {"kv_cache_dtype": "float16"}


class RadixlmNgramAdapter(RadixlmAdapter):
    """radixlm.Engine with n-gram speculation (--speculative-algorithm ngram, the goodput
    draft budget)."""

    options = {"speculative_algorithm": "ngram"}


class RadixlmNoMixAdapter(RadixlmAdapter):
    """radixlm.Engine without mixed chunks (--no-enable-mixed-chunk: a decode step of its
    own follows every prefill step)."""

    options = {"enable_mixed_chunk": False}


class StaticBatchAdapter:
    """Static batching for engines without a scheduler: the turns of all sessions run in
    lockstep (turn k of every session is one batch set), split into batches of at most
    max_batch requests with the same output length; later batches wait. Subclasses set
    self.tok and self.max_batch and implement `_batch(timers, out_len)`, which generates
    out_len tokens for every timer's prompt and stamps each token as it is produced."""

    tok: Any
    max_batch: int

    def _batch(self, timers: list[Timer], out_len: int) -> None:
        raise NotImplementedError

    def run(self, sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        done: list[dict[str, Any]] = []
        done_by: dict[int, Timer] = {}
        for k in range(max(len(s["turns"]) for s in sessions)):
            live = [i for i, s in enumerate(sessions) if k < len(s["turns"])]
            timers = []
            for i in live:
                ids = sessions[i]["turns"][k][0]
                if k and sessions[i].get("resend_history"):
                    prev = done_by[i]
                    ids = next_prompt(self.tok, prev.prompt_ids, prev.output_ids, ids)
                timers.append(Timer(t0, ids, i, k))
            by_len: dict[int, list[Timer]] = {}
            for t in timers:
                by_len.setdefault(sessions[t.session]["turns"][k][1], []).append(t)
            for out_len, group in by_len.items():
                for b in range(0, len(group), self.max_batch):
                    self._batch(group[b : b + self.max_batch], out_len)
            done_by = {t.session: t for t in timers}
            done += [t.result() for t in timers]
        return done

    def close(self) -> None:
        pass


class TransformersAdapter(StaticBatchAdapter):
    """transformers `generate` in static batches (left padding). Token times come from a
    StoppingCriteria that runs after each decoding step."""

    def __init__(self, model_dir: str, threads: int, spec: dict[str, Any]):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.max_batch = spec["max_batch"]
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0

    def _batch(self, timers: list[Timer], out_len: int) -> None:
        from transformers import StoppingCriteria, StoppingCriteriaList

        torch = self.torch
        width = max(len(t.prompt_ids) for t in timers)
        ids = torch.full((len(timers), width), self.pad, dtype=torch.int64)
        mask = torch.zeros_like(ids)
        for r, t in enumerate(timers):
            n = len(t.prompt_ids)
            ids[r, width - n :] = torch.tensor(t.prompt_ids)
            mask[r, width - n :] = 1

        class Stamp(StoppingCriteria):
            def __call__(self, input_ids, scores, **kw):
                for r, t in enumerate(timers):
                    t.tokens([int(input_ids[r, -1])])
                return torch.zeros(input_ids.shape[0], dtype=torch.bool)

        with torch.inference_mode():
            self.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=out_len,
                min_new_tokens=out_len, pad_token_id=self.pad,
                stopping_criteria=StoppingCriteriaList([Stamp()]),
            )  # fmt: skip


class OrtGenaiAdapter(StaticBatchAdapter):
    """onnxruntime-genai `Generator` in static batches (no scheduler, no prefix cache).
    model_dir is the directory its model builder exported (fp32, CPU); the thread count
    is overlaid on its genai_config.json (decoder session intra_op_num_threads). Prompts
    are right-padded with the config's pad id into an int32 [batch, width] array (the
    attention mask is derived from the pad id, so prompts must not contain it; the
    workloads exclude special tokens); max_length = min_length = width + out_len, so
    every row yields exactly out_len greedy tokens, EOS included. Each
    `generate_next_token()` is one step; its tokens are stamped right after it."""

    def __init__(self, model_dir: str, threads: int, spec: dict[str, Any]):
        import numpy as np
        import onnxruntime_genai as og
        from transformers import AutoTokenizer

        self.np, self.og = np, og
        config = og.Config(model_dir)
        options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
        self.model = og.Model(config)
        with open(os.path.join(model_dir, "genai_config.json")) as f:
            self.pad = json.load(f)["model"]["pad_token_id"]
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.max_batch = spec["max_batch"]

    def _batch(self, timers: list[Timer], out_len: int) -> None:
        np, og = self.np, self.og
        width = max(len(t.prompt_ids) for t in timers)
        ids = np.full((len(timers), width), self.pad, dtype=np.int32)
        for r, t in enumerate(timers):
            ids[r, : len(t.prompt_ids)] = t.prompt_ids
        params = og.GeneratorParams(self.model)
        params.set_search_options(
            do_sample=False, batch_size=len(timers), max_length=width + out_len,
            min_length=width + out_len,
        )  # fmt: skip
        gen = og.Generator(self.model, params)
        gen.append_tokens(ids)
        while not gen.is_done():
            gen.generate_next_token()
            for t, tok in zip(timers, gen.get_next_tokens()):
                t.tokens([int(tok)])


class OpenVINOAdapter:
    """OpenVINO GenAI `ContinuousBatchingPipeline` (paged KV cache, prefix caching) on the
    CPU plugin, driven step by step: requests enter through `add_request` with token-id
    tensors (int64, shape [1, prompt_len]); after every `step()` each live handle's new
    tokens are read and stamped, so TTFT and ITL are per step. model_dir is the IR
    directory exported by optimum-cli (weights fp32, compute f32 by the
    INFERENCE_PRECISION_HINT property; the KV cache keeps the plugin's default precision,
    f16, as llama.cpp's does). The pool holds max_total_tokens tokens (CPU blocks of
    OV_CPU_BLOCK tokens), like radixlm's. Cached tokens: None (the
    pipeline reports no per-request prefix hits)."""

    # KV block of the CPU plugin (openvino-genai 2026.4): 256 blocks report 188,743,680
    # bytes = 8192 tokens x 30 layers x 2 x 3 heads x 64 x 2 B (f16), a 29-token request
    # holds one block.
    OV_CPU_BLOCK = 32

    def __init__(self, model_dir: str, threads: int, spec: dict[str, Any]):
        import numpy as np
        import openvino as ov
        import openvino_genai as ov_genai
        from transformers import AutoTokenizer

        self.np, self.ov, self.ov_genai = np, ov, ov_genai
        sched = ov_genai.SchedulerConfig()
        sched.enable_prefix_caching = True
        sched.num_kv_blocks = -(-spec["max_total_tokens"] // self.OV_CPU_BLOCK)
        # f32 compute like every engine here: on CPUs with AVX-512 BF16 or AMX the CPU
        # plugin's default inference precision is bf16.
        props = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}
        self.pipe = ov_genai.ContinuousBatchingPipeline(model_dir, sched, "CPU", props)
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.next_id = 0

    def _config(self, out_len: int):
        cfg = self.ov_genai.GenerationConfig()
        cfg.max_new_tokens, cfg.min_new_tokens = out_len, out_len
        cfg.do_sample, cfg.ignore_eos, cfg.apply_chat_template = False, True, False
        return cfg

    def run(self, sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        np, ov = self.np, self.ov
        running = self.ov_genai.GenerationStatus.RUNNING
        t0 = time.perf_counter()
        done: list[dict[str, Any]] = []
        live: list[tuple[Any, Timer]] = []

        def submit(timer: Timer, out_len: int) -> None:
            ids = ov.Tensor(np.asarray([timer.prompt_ids], dtype=np.int64))
            live.append((self.pipe.add_request(self.next_id, ids, self._config(out_len)), timer))
            self.next_id += 1

        for i, s in enumerate(sessions):
            submit(Timer(t0, s["turns"][0][0], i, 0), s["turns"][0][1])
        while live:
            self.pipe.step()
            for entry in list(live):
                handle, timer = entry
                if handle.can_read():
                    for out in handle.read().values():
                        timer.tokens(list(out.generated_ids))
                if handle.get_status() == running:
                    continue
                live.remove(entry)
                done.append(timer.result())
                nxt = next_turn(self.tok, sessions, timer, t0)
                if nxt is not None:
                    submit(*nxt)
        return done

    def close(self) -> None:
        pass


ADAPTERS = {"radixlm": RadixlmAdapter, "radixlm-kv16": RadixlmKv16Adapter,
            "radixlm-ngram": RadixlmNgramAdapter, "radixlm-nomix": RadixlmNoMixAdapter,
            "transformers": TransformersAdapter,
            "openvino": OpenVINOAdapter, "ortgenai": OrtGenaiAdapter}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=sorted(ADAPTERS), required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    spec = json.loads(open(args.spec).read())
    t_load = time.perf_counter()
    adapter = ADAPTERS[args.engine](args.model_dir, args.threads, spec)
    report: dict[str, Any] = {"load_s": time.perf_counter() - t_load, "workloads": {}}
    for w in spec["workloads"]:
        t0 = time.perf_counter()
        results = adapter.run(w["sessions"])
        report["workloads"][w["name"]] = {
            "duration_s": time.perf_counter() - t0,
            "requests": results,
            "loadavg": os.getloadavg(),
        }
    adapter.close()
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
