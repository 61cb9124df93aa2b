"""Structured output over HTTP with the real `openai` client: response_format json_object
and json_schema (non-streamed, streamed, batched), native regex / ebnf, and refusals.

The bundled 135M model is weak: the tests check validity and structure, not content.
Schemas bound every string, number and array, so every sampled output ends in time.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from radixlm.runtime.sampling.grammar import MAX_SPEC_CHARS

from .conftest import MODEL

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "country": {"type": "string", "maxLength": 24},
            },
            "required": ["city", "country"],
            "additionalProperties": False,
        },
        "hobbies": {
            "type": "array",
            "items": {"type": "string", "maxLength": 16},
            "minItems": 1,
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "address", "hobbies"],
    "additionalProperties": False,
}
PERSON_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON, "strict": True},
}
ASK_PERSON = [{"role": "user", "content": "Describe a person as JSON."}]
ASK_OBJECT = [
    {"role": "user", "content": "Give me a JSON object with the name and age of a person."}
]


def _chat(client, messages, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=kw.pop("max_tokens", 160), **kw
    )


def _valid_person(text: str) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, PERSON)
    return value


def test_json_object(client):
    resp = _chat(client, ASK_OBJECT, temperature=0, response_format={"type": "json_object"})
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content), dict)
    assert resp.usage.completion_tokens > 0


def test_nested_schema_streamed_equals_non_streamed(client):
    resp = _chat(client, ASK_PERSON, temperature=0, response_format=PERSON_FORMAT)
    assert resp.choices[0].finish_reason == "stop"
    text = resp.choices[0].message.content
    _valid_person(text)
    chunks = list(
        _chat(client, ASK_PERSON, temperature=0, response_format=PERSON_FORMAT, stream=True)
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_batched_mixed_requests(client):
    """Constrained (sampled and greedy) and unconstrained requests run concurrently; the
    unconstrained ones equal their greedy outputs run alone."""
    plain = [
        [{"role": "user", "content": "Name three rivers."}],
        [{"role": "user", "content": "What is 2 + 2?"}],
    ]
    alone = [
        _chat(client, m, temperature=0, max_tokens=24).choices[0].message.content for m in plain
    ]
    jobs = [lambda m=m: _chat(client, m, temperature=0, max_tokens=24) for m in plain]
    jobs += [
        lambda s=s: _chat(
            client, ASK_PERSON, temperature=1.0, seed=s, response_format=PERSON_FORMAT
        )
        for s in range(3)
    ]
    jobs.append(
        lambda: _chat(client, ASK_OBJECT, temperature=0, response_format={"type": "json_object"})
    )
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: job(), jobs))
    assert [r.choices[0].message.content for r in results[:2]] == alone
    for r in results[2:5]:
        assert r.choices[0].finish_reason == "stop"
        _valid_person(r.choices[0].message.content)
    assert isinstance(json.loads(results[5].choices[0].message.content), dict)


def test_completions_regex_extension(client):
    resp = client.completions.create(
        model=MODEL,
        prompt="My phone number is",
        max_tokens=24,
        temperature=0,
        extra_body={"regex": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"},
    )
    assert re.fullmatch(r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}", resp.choices[0].text)
    assert resp.choices[0].finish_reason == "stop"


def test_completions_response_format(client):
    """response_format on /v1/completions (as vLLM and SGLang accept it): json_schema and
    json_object constrain the text, "text" leaves it as without the field."""

    def complete(prompt, **extra):
        return client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=160, temperature=0, extra_body=extra
        ).choices[0]

    person = complete("A person as JSON:", response_format=PERSON_FORMAT)
    assert person.finish_reason == "stop"
    _valid_person(person.text)
    anything = complete("A JSON object:", response_format={"type": "json_object"})
    assert isinstance(json.loads(anything.text), dict)
    plain = complete("A JSON object:")
    assert complete("A JSON object:", response_format={"type": "text"}).text == plain.text
    assert plain.text != anything.text
    with pytest.raises(openai.BadRequestError) as err:
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}
        complete("x", response_format=bad)
    assert err.value.body["param"] == "response_format.json_schema.schema"


def test_native_regex_and_ebnf(http):
    date = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])"
    body = {
        "text": ["The date today is", "The answer is"],
        "sampling_params": [
            {"max_new_tokens": 20, "temperature": 0, "regex": date},
            {"max_new_tokens": 20, "temperature": 0, "ebnf": 'root ::= ("yes" | "no") "!"'},
        ],
    }
    out = http.post("/generate", json=body)
    assert out.status_code == 200, out.text
    first, second = out.json()
    assert re.fullmatch(date, first["text"])
    assert second["text"] in ("yes!", "no!")
    for r in (first, second):
        assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    schema = {"max_new_tokens": 160, "temperature": 0, "json_schema": json.dumps(PERSON)}
    streamed = http.post(
        "/generate", json={"text": "A person as JSON:", "sampling_params": schema, "stream": True}
    )
    last = [line for line in streamed.text.splitlines() if line.startswith("data: {")][-1]
    _valid_person(json.loads(last[len("data: ") :])["text"])


@pytest.mark.parametrize(
    "extra, param, message",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": 5}},
                }
            },
            "response_format.json_schema.schema",
            "not a valid JSON schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"required": "a"}},
                }
            },
            "response_format.json_schema.schema",
            "not a valid JSON schema at required",
        ),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            "needs a 'json_schema'",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema",
            "name",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "'json_object'"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"properties": {"a": {"$ref": "http://example.com/a.json"}}},
                    },
                }
            },
            "response_format.json_schema.schema",
            "only references inside a schema",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"properties": {"a": {"$ref": "http://e/a.json"}}},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
            "only references inside a schema",
        ),
        ({"extra_body": {"regex": "[a-"}}, "regex", "invalid regex"),
        ({"extra_body": {"regex": "a" * (MAX_SPEC_CHARS + 1)}}, "regex", "characters; at most"),
        ({"extra_body": {"ebnf": "root ::= nothing"}}, "ebnf", "invalid ebnf"),
        (
            {"response_format": {"type": "json_object"}, "extra_body": {"regex": "a"}},
            "regex",
            "cannot be combined",
        ),
    ],
)
def test_chat_grammar_errors(client, extra, param, message):
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, ASK_OBJECT, max_tokens=4, **extra)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param
    assert message in err.value.body["message"]


@pytest.mark.parametrize(
    "params, message",
    [
        ({"regex": "(("}, "invalid regex"),
        ({"regex": "a" * (MAX_SPEC_CHARS + 1)}, "characters; at most"),
        ({"json_schema": "{oops"}, "json_schema is not valid JSON"),
        ({"json_schema": '{"type": "object", "minProperties": "2"}'}, "not a valid JSON schema"),
        ({"ebnf": "root ::= ", "regex": "a"}, "at most one"),
    ],
)
def test_native_grammar_errors(http, params, message):
    out = http.post("/generate", json={"text": "x", "sampling_params": params})
    assert out.status_code == 400, out.text
    err = out.json()["error"]
    assert err["param"] == "sampling_params" and message in err["message"]
