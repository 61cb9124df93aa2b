"""The sampling options of the language have one list of names: `ir.SamplingOptions`.

`run` and `run_batch` spell the program-level ones out (for IDEs and `help`) and `gen`
spells out every one; these tests keep those signatures in step with the dataclass."""

from __future__ import annotations

import dataclasses
import inspect

import radixlm as rl
from radixlm.lang import ir
from radixlm.lang.program import Program


def _defaults(func) -> dict[str, object]:
    params = inspect.signature(func).parameters
    return {name: params[name].default for name in ir.RUN_OPTIONS if name in params}


def test_run_and_run_batch_take_every_run_option_with_the_same_defaults():
    run, run_batch = _defaults(Program.run), _defaults(Program.run_batch)
    assert list(run) == list(ir.RUN_OPTIONS)
    assert run_batch == run
    assert run["max_new_tokens"] == 128 and run["temperature"] == 1.0


def test_gen_takes_every_option_and_sets_each():
    values = {
        "max_new_tokens": 5,
        "min_new_tokens": 2,
        "stop": ["x"],
        "stop_token_ids": [3],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 7,
        "min_p": 0.1,
        "frequency_penalty": 0.2,
        "presence_penalty": 0.3,
        "ignore_eos": True,
        "return_logprob": True,
        "logprob_start_len": 1,
        "top_logprobs_num": 4,
        "return_text_in_logprobs": True,
        "priority": 2,
        "dtype": None,
        "regex": "[ab]+",
        "json_schema": None,
        "ebnf": None,
    }
    assert set(values) == {f.name for f in dataclasses.fields(ir.SamplingOptions)}
    renamed = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
    node = rl.gen("v", **{renamed.get(k, k): v for k, v in values.items()})
    assert node.options == ir.SamplingOptions(**values)
    schema = rl.gen("j", json_schema={"type": "object"}).options.json_schema
    assert schema == '{"type": "object"}'
