"""When backends load their chat templates: once, whatever the number of program threads
that first need it, and for `RuntimeEndpoint` at construction, before any program runs."""

from __future__ import annotations

import threading
import time

import radixlm as rl
from radixlm.lang import chat_template as templates
from radixlm.lang.backend.base import Backend
from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint

ROLES = ("system", "user", "assistant")
MARKED = templates.ChatTemplate(
    name="marked", role_prefix_and_suffix={r: (f"<{r}>", f"</{r}>") for r in ROLES}
)


class SlowLoad(Backend):
    """A backend whose template load takes a while and counts its calls."""

    def __init__(self):
        self.loads = 0

    def _load_chat_template(self):
        self.loads += 1
        time.sleep(0.2)
        return templates.ChatTemplate(name=f"load {self.loads}", role_prefix_and_suffix={})

    def generate(self, prompt, options, on_delta=None):
        raise NotImplementedError


class Wrapper(SlowLoad):
    """Loads its template through another backend (as the benchmark's metering does)."""

    def __init__(self, inner: Backend):
        super().__init__()
        self.inner = inner

    def _load_chat_template(self):
        return self.inner.chat_template


def read_at_once(backend: Backend, n: int) -> list[templates.ChatTemplate | None]:
    """`backend.chat_template` read by `n` threads released together."""
    seen: list[templates.ChatTemplate | None] = [None] * n
    barrier = threading.Barrier(n)

    def read(i: int) -> None:
        barrier.wait()
        seen[i] = backend.chat_template

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return seen


def test_threads_reading_at_once_share_one_load():
    backend = SlowLoad()
    seen = read_at_once(backend, 8)
    assert backend.loads == 1
    assert [t.name for t in seen] == ["load 1"] * 8
    assert all(t is seen[0] for t in seen)


def test_a_wrapper_loads_through_the_backend_it_wraps():
    inner = SlowLoad()
    seen = read_at_once(Wrapper(inner), 4)
    assert inner.loads == 1
    assert [t.name for t in seen] == ["load 1"] * 4


def test_runtime_endpoint_resolves_its_template_at_construction(monkeypatch):
    loaded: list[str] = []
    bodies: list[dict] = []

    def for_model(model: str) -> templates.ChatTemplate:
        loaded.append(model)
        return MARKED

    def call(self, method, path, body=None):
        if path == "/get_model_info":
            return {"model_path": "served-model"}
        bodies.append(body)
        return [{"text": "ok", "meta_info": {"finish_reason": {"type": "length"}}}]

    monkeypatch.setattr(templates, "for_model", for_model)
    monkeypatch.setattr(RuntimeEndpoint, "_call", call)
    backend = RuntimeEndpoint("http://127.0.0.1:9")
    assert loaded == ["served-model"]

    @rl.function
    def chat(s):
        s += rl.system("Be brief.")
        s += rl.assistant(rl.gen("reply", max_tokens=2))

    state = chat.run(backend=backend, temperature=0)
    assert state.error() is None and state["reply"] == "ok"
    assert loaded == ["served-model"]  # no second load when the program wrote roles
    assert bodies[0]["text"] == ["<system>Be brief.</system><assistant>"]
    backend.shutdown()


def test_a_given_template_skips_the_load(monkeypatch):
    loaded: list[str] = []
    monkeypatch.setattr(templates, "for_model", lambda model: loaded.append(model))
    monkeypatch.setattr(
        RuntimeEndpoint, "_call", lambda self, method, path, body=None: {"model_path": "m"}
    )
    backend = RuntimeEndpoint("http://127.0.0.1:9", chat_template=MARKED)
    assert loaded == [] and backend.chat_template is MARKED
    backend.shutdown()
