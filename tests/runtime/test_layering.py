"""Only the scheduler changes scheduler state: an AST check over radixlm/ outside sched/.

A value counts as the Scheduler when the expression naming it ends in ``sched`` or
``scheduler`` (``sched``, ``self.scheduler``, ``stack.scheduler``, ...): the names the
code base gives it. Outside ``radixlm/runtime/sched/`` a module must not

* read or write a private attribute of it (``sched._run``, ``scheduler._pending``; a name
  with one leading underscore, dunders excepted), or
* change its queues and counters: assign or augment-assign ``sched.running``,
  ``sched.waiting``, ``sched.counters`` or ``sched.ratio`` or anything inside them
  (``sched.counters.decode_steps += 1``), or call a method on one of them
  (``sched.running.remove(r)``, ``sched.ratio.on_decode_step()``). Reading them
  (``len(sched.running)``, ``sched.ratio.value``) is allowed.

Decode strategies get a `DecodeContext` and return a `DecodeResult` that the scheduler
commits (`runtime/sched/decode.py`). The check is by name, so it is a guard against the
habit, not a proof: a Scheduler bound to another name escapes it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import radixlm

ROOT = Path(radixlm.__file__).resolve().parent
SCHED = ROOT / "runtime" / "sched"
SCHEDULER_NAMES = {"sched", "scheduler"}
STATE = {"running", "waiting", "counters", "ratio"}


def _is_scheduler(node: ast.expr) -> bool:
    """Whether the expression names the Scheduler (by its last name part)."""
    if isinstance(node, ast.Name):
        return node.id in SCHEDULER_NAMES
    return isinstance(node, ast.Attribute) and node.attr in SCHEDULER_NAMES


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _touches_state(node: ast.expr) -> bool:
    """Whether an assignment target or a called object is `sched.<state>` or lies inside
    it (through attributes and subscripts)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute) and node.attr in STATE and _is_scheduler(node.value):
            return True
        node = node.value
    return False


def _targets(node: ast.AST) -> list[ast.expr]:
    """Assignment targets of a statement, tuple and list targets unpacked."""
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        found = [node.target]
    else:
        return []
    out: list[ast.expr] = []
    while found:
        t = found.pop()
        if isinstance(t, ast.Tuple | ast.List):
            found.extend(t.elts)
        elif isinstance(t, ast.Starred):
            found.append(t.value)
        else:
            out.append(t)
    return out


def violations(source: str, filename: str = "<source>") -> list[str]:
    """'file:line: what' for every private access or state change of the Scheduler."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            if _is_scheduler(node.value):
                found.append(f"{filename}:{node.lineno}: private {ast.unparse(node)}")
        for target in _targets(node):
            if _touches_state(target):
                found.append(f"{filename}:{node.lineno}: writes {ast.unparse(target)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if _touches_state(node.func.value):
                found.append(f"{filename}:{node.lineno}: calls {ast.unparse(node.func)}")
    return found


def test_nothing_outside_sched_reaches_into_the_scheduler():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if SCHED in path.parents:
            continue
        found += violations(path.read_text(), str(path.relative_to(ROOT.parent)))
    assert not found, "\n".join(found)


def test_the_check_flags_private_access_and_state_changes():
    bad = """
outputs, sched._pending = sched._pending, []
out = sched._run([], reqs)
self.scheduler._fail(reqs)
sched.counters.decode_steps += 1
sched.running = [r for r in sched.running if r not in finished]
stack.scheduler.waiting[0] = req
sched.ratio.on_decode_step()
sched.running.remove(req)
"""
    got = violations(bad)
    assert sorted({int(v.split(":")[1]) for v in got}) == list(range(2, 10)), got
    ok = """
n = len(sched.running) + len(scheduler.waiting)
value = sched.ratio.value
self._pending = []
sched.kv.alloc(req, 0, 1)
sched.__class__
"""
    assert violations(ok) == []


def test_sched_does_not_import_speculative():
    """sched/ sits below speculative/: the strategy is passed in (`build_stack`)."""
    found = []
    for path in sorted(SCHED.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.name}:{node.lineno}: {n}" for n in names if ".speculative" in n]
    assert not found, found


def test_the_stack_builds_the_decoder_and_the_scheduler_needs_it():
    from radixlm.config import ServerArgs
    from radixlm.runtime.sched.decode import NormalDecode
    from radixlm.runtime.sched.scheduler import Scheduler
    from radixlm.runtime.server.stack import make_decoder
    from radixlm.runtime.speculative.decode import SpeculativeDecode

    assert isinstance(make_decoder(ServerArgs(), runner=None), NormalDecode)
    args = ServerArgs(speculative_algorithm="ngram")
    assert isinstance(make_decoder(args, runner=None), SpeculativeDecode)  # n-gram: no runner
    with pytest.raises(ValueError, match="make_speculative_decode"):
        Scheduler(args, runner=None, eos_token_ids=[])
