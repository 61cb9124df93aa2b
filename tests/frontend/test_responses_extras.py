"""Responses API: DELETE /v1/responses/{id}, cache_salt, and the route in /openapi.json
(real server, bundled model). The reasoning item is tested with a
--reasoning-parser server in test_tool_parsers_server.py."""

from __future__ import annotations

import uuid

GREEDY = {"temperature": 0, "max_output_tokens": 2}


def _post(http, **body) -> dict:
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_delete_drops_a_stored_response(http):
    resp = _post(http, input="Hi", **GREEDY)
    r = http.delete(f"/v1/responses/{resp['id']}")
    assert r.status_code == 200
    assert r.json() == {"id": resp["id"], "object": "response.deleted", "deleted": True}
    assert http.get(f"/v1/responses/{resp['id']}").status_code == 404
    again = http.delete(f"/v1/responses/{resp['id']}")
    assert again.status_code == 404
    assert again.json()["error"]["code"] == "response_not_found"
    assert again.json()["error"]["param"] == "response_id"
    follow = http.post("/v1/responses", json={"input": "Hi", "previous_response_id": resp["id"]})
    assert follow.status_code == 404
    assert follow.json()["error"]["code"] == "previous_response_not_found"


def test_cache_salt_separates_cached_prefixes(http):
    story = "Tell me a long story about a red fox and a river. " * 6

    def cached(text: str, **salt) -> int:
        resp = _post(http, input=text, store=False, **GREEDY, **salt)
        return resp["usage"]["input_tokens_details"]["cached_tokens"]

    # Prompts whose first characters differ share no token after the chat template's
    # preamble (the system prompt); one unsalted request caches that preamble first.
    cached("Hello")
    text = f"Q{uuid.uuid4().hex} {story}"
    preamble = cached(f"Z{uuid.uuid4().hex} {story}")
    assert preamble > 0
    assert cached(text, cache_salt="tenant-a") == 0
    assert cached(text, cache_salt="tenant-a") > preamble + 40  # the tenant shares it
    assert cached(text, cache_salt="tenant-b") == 0
    assert cached(text) == preamble  # unsalted requests never see a tenant's prefix
    r = http.post("/v1/responses", json={"input": "Hi", "cache_salt": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_openapi_documents_the_responses_routes(http):
    doc = http.get("/openapi.json").json()
    create = doc["paths"]["/v1/responses"]["post"]
    ref = create["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/ResponsesRequest"
    ok = create["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/ResponseObject"}
    assert "text/event-stream" in ok
    assert set(create["responses"]) == {"200", "400", "401", "403", "404", "415", "503", "504"}
    by_id = doc["paths"]["/v1/responses/{response_id}"]
    assert set(by_id) == {"get", "delete"}
    deleted = by_id["delete"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert deleted == {"$ref": "#/components/schemas/ResponseDeleted"}
    assert set(by_id["get"]["responses"]) == {"200", "400", "401", "404"}
    schemas = doc["components"]["schemas"]
    assert "cache_salt" in schemas["ResponsesRequest"]["properties"]
    item_types = [
        s["$ref"] for s in schemas["ResponseObject"]["properties"]["output"]["items"]["anyOf"]
    ]
    assert item_types == [
        "#/components/schemas/ReasoningItem",
        "#/components/schemas/MessageItem",
        "#/components/schemas/FunctionCallItem",
    ]


CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}
ASK = {"role": "user", "content": "Weather in Rome?"}


def _error(http, body) -> dict:
    r = http.post("/v1/responses", json={"max_output_tokens": 2, **body})
    assert r.status_code == 400, r.text
    return r.json()["error"]


def test_function_call_output_needs_an_earlier_call(http):
    err = _error(http, {"input": [ASK, OUTPUT]})
    assert err["param"] == "input.1.call_id" and "'call_1'" in err["message"]
    # The call after its output does not count; a call id of another call does not either.
    assert _error(http, {"input": [ASK, OUTPUT, CALL]})["param"] == "input.1.call_id"
    other = {**CALL, "call_id": "call_2"}
    assert _error(http, {"input": [ASK, other, OUTPUT]})["param"] == "input.2.call_id"
    assert _post(http, input=[ASK, CALL, OUTPUT], **GREEDY)["status"] == "incomplete"


def test_function_call_output_may_answer_a_call_of_an_earlier_response(http):
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    first = _post(http, input=[ASK], tools=[tool], tool_choice="required", max_output_tokens=40)
    (call,) = [i for i in first["output"] if i["type"] == "function_call"]
    answer = {**OUTPUT, "call_id": call["call_id"]}
    follow = _post(http, input=[answer], tools=[tool], previous_response_id=first["id"], **GREEDY)
    assert follow["previous_response_id"] == first["id"]
    # Not a call of that response: refused.
    err = _error(http, {"input": [OUTPUT], "previous_response_id": first["id"]})
    assert err["param"] == "input.0.call_id"


def test_function_call_arguments_must_be_json(http):
    bad = {**CALL, "arguments": "{city: Rome"}
    err = _error(http, {"input": [ASK, bad, OUTPUT]})
    assert err["param"] == "input.1.arguments" and err["code"] == "invalid_value"


def test_metadata_has_openai_bounds(http):
    ok = {f"k{i}": "v" * 512 for i in range(16)}
    ok["x" * 64] = ok.pop("k0")
    assert _post(http, input="Hi", metadata=ok, store=False, **GREEDY)["metadata"] == ok
    for metadata in (
        {f"k{i}": "v" for i in range(17)},
        {"x" * 65: "v"},
        {"k": "v" * 513},
    ):
        err = _error(http, {"input": "Hi", "metadata": metadata})
        assert err["param"] == "metadata" and err["type"] == "invalid_request_error"
