import json, httpx, sys
sys.path.insert(0, "tests/frontend")
from conftest import running_server
def run(url):
    c = httpx.Client(base_url=url, timeout=120)
    for stop in [" the", ".", "skyscrapers and", "a little"]:
        body = {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stop": stop, "logprobs": 1}
        r = c.post("/v1/completions", json=body).json()
        ch = r["choices"][0]
        print("full", stop, repr(ch["text"][-20:]), r["usage"]["completion_tokens"], len(ch["logprobs"]["tokens"]))
        with c.stream("POST", "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}) as s:
            toks, text, usage = 0, "", None
            for line in s.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]": continue
                d = json.loads(line[6:])
                if d.get("usage"): usage = d["usage"]
                for ch in d["choices"]:
                    text += ch["text"]; toks += len((ch["logprobs"] or {}).get("tokens", []))
        print("strm", stop, repr(text[-20:]), usage["completion_tokens"], toks)
        g = c.post("/generate", json={"text": "Once upon a time", "sampling_params": {"max_new_tokens": 40, "temperature": 0, "stop": stop}, "return_logprob": True}).json()
        print("gen ", stop, repr(g["text"][-20:]), g["meta_info"]["completion_tokens"], len(g["meta_info"]["output_token_logprobs"]), len(g["output_ids"]))
extra = sys.argv[1:]
with running_server(*extra) as url:
    run(url)
