"""Continuous-batching scheduler: cache-aware admission, chunked prefill, retraction, abort.

Each `step()` runs one iteration (Orca-style iteration-level batching, Yu et al. 2022):

* EXTEND: the request mid-chunk continues, then waiting requests are admitted in the
  order of the schedule policy (`radix/policy.py`) under three budgets -- KV slots
  (free + evictable, minus a reservation for running decodes), prefill tokens per step
  (``min(--chunked-prefill-size, --max-prefill-tokens)``) and request rows. A prompt
  longer than the remaining token budget is split: its first chunk runs now, the rest
  in later steps (at most one request is mid-chunk). After the step every prefilled
  prompt (or chunk) is inserted into the radix cache, so the next chunk and later
  requests hit it. Requests sharing a not-yet-cached prefix with one being prefilled
  wait one round (`InBatchPrefixGuard`), so the prefix is computed once.
* DECODE: one token for every running request. With mixed chunks (``--enable-mixed-chunk``,
  the default) the running decodes ride in each extend step's forward, so an extend that
  meets running requests (a new turn arriving beside other sessions' decodes) costs no
  decode step of their own; with ``--no-enable-mixed-chunk`` a decode step runs after
  every extend step, before the next one. Either way a long prompt delays other streams
  by one chunk, not by the prompt.
* When a decode step lacks KV slots, requests are retracted (`Retractor`, `retraction.py`):
  their computed KV is inserted into the cache, they go back to the front of the queue,
  and on resume they prefill prompt + generated tokens (mostly cache hits) and report
  only new tokens.

With ``--slo-ttft-ms`` / ``--slo-tpot-ms`` the prefill budget of each step and the
admission order come from `SLOController` (`runtime/sched/slo.py`, docs/slo.md) instead of
``--chunked-prefill-size`` and the policy alone; priorities (`priority.py`) order
admission and retraction in every mode.

KV ownership (rows, slots, cache insertion, reservations) is kept by `KVLedger`
(`runtime/sched/kv_ledger.py`); `memory_accounting()` checks free + evictable + protected +
held == total.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future

from radixlm.config import ServerArgs
from radixlm.radix import make_prefix_cache
from radixlm.radix.policy import make_policy, match_len
from radixlm.runtime.executor.kv_tier import make_kv_tier
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.sampling.grammar import GrammarBackend, GrammarCompiler
from radixlm.runtime.sampling.jump_forward import JumpForward
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.sched.admission import Added, Plan, PrefillAdder, start_request
from radixlm.runtime.sched.decode import (
    DecodeContext,
    DecodeResult,
    DecodeStrategy,
    NormalDecode,
)
from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.sched.forward_step import ForwardStep
from radixlm.runtime.sched.intake import Intake
from radixlm.runtime.sched.jump import Drafts
from radixlm.runtime.sched.kv_ledger import KVLedger
from radixlm.runtime.sched.pins import PinTable
from radixlm.runtime.sched.priority import by_priority
from radixlm.runtime.sched.request import Req, ReqOutput
from radixlm.runtime.sched.retraction import NewTokenRatio, Retractor
from radixlm.runtime.sched.sessions import SessionManager, SessionParams
from radixlm.runtime.sched.slo import SLOController
from radixlm.runtime.sched.stats import SchedulerCounters, format_stats, scheduler_stats
from radixlm.runtime.sched.stop import StopChecker

logger = logging.getLogger(__name__)


class Scheduler:
    """Schedules requests over one ModelRunner.

    Args:
        args: engine settings. runner: the loaded model and pools.
        eos_token_ids: token ids that end generation unless `ignore_eos`.
        tokenizer: decodes output tails for stop strings (requests with `stop` need it).
        decoder: the decode strategy (`runtime/sched/decode.py`); default `NormalDecode`.
            A speculative one is built by `runtime/server/stack.py::build_stack`.
        clock: seconds for step times, first tokens and SLO deadlines (a test steps its
            own); requests' `arrival_time` must be on the same clock.

    Raises ValueError when args name a speculative algorithm but no decoder is given
    (the scheduler cannot build one itself).
    """

    def __init__(
        self,
        args: ServerArgs,
        runner: ModelRunner,
        eos_token_ids: list[int],
        tokenizer=None,
        decoder: DecodeStrategy | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if decoder is None and args.speculative_algorithm is not None:
            raise ValueError(
                f"speculative_algorithm={args.speculative_algorithm!r} needs its decoder: "
                "pass radixlm.runtime.speculative.make_speculative_decode(args, runner)"
            )
        self.args = args
        self.runner = runner
        self.page_size = args.page_size
        self.allocator = runner.allocator
        self.req_pool = runner.req_to_token_pool
        self.table = self.req_pool.req_to_token
        self.tree = make_prefix_cache(
            args.disable_radix_cache,
            args.page_size,
            self.allocator.free,
            tier=make_kv_tier(args, runner.kv_pool, runner.max_total_tokens),
            allocator=self.allocator,
            write_policy=args.hicache_write_policy,
        )
        self.policy = make_policy(
            args.schedule_policy, self.tree, args.schedule_fallback_queue_len, args.random_seed
        )
        self.ratio = NewTokenRatio(args.schedule_conservativeness)
        self.retractor = Retractor(self)  # memory pressure: retracts requests for room
        self.kv = KVLedger(runner, self.tree, self.ratio)  # rows, slots, reservations
        budget = args.session_pin_budget
        self.pins = PinTable(self.tree, self.allocator.total // 4 if budget is None else budget)
        bos = getattr(tokenizer, "bos_token_id", None)
        self.sessions = SessionManager(self.pins, args.session_timeout, bos)
        self.counters = SchedulerCounters()
        self.stop = StopChecker(eos_token_ids, runner.context_len, tokenizer)
        self.sampler = Sampler(eos_token_ids)
        vocab = runner.config.vocab_size
        self.grammars = GrammarBackend(GrammarCompiler(tokenizer, vocab, eos_token_ids))
        self.decoder: DecodeStrategy = decoder if decoder is not None else NormalDecode()
        self._decode_ctx = DecodeContext(self.kv, self.stop, self._plain_decode)
        # Jump-forward drafts, and lookup drafts of requests riding along in mixed steps,
        # are verified in the plain forward path only.
        jump = not args.disable_jump_forward and self.decoder.allows_jump_forward
        jumper = JumpForward(tokenizer) if jump and tokenizer is not None else None
        lookup = self.decoder.constrained_lookup if jumper is not None else None
        riding = self.decoder.riding_lookup
        drafts = None
        if jumper is not None or riding is not None:
            drafts = Drafts(jumper, runner.context_len, lookup, riding)
        self.forward_step = ForwardStep(
            runner,
            self.kv,
            self.sampler,
            self.grammars,
            self.stop,
            self._after_forward,
            drafts,
        )
        self.waiting: list[Req] = []
        #: Requests whose grammar compiles on a worker thread, with its future; they join
        #: `waiting` at the first step after it is done (`Intake.admit_compiled`).
        self.compiling: list[tuple[Req, Future]] = []
        self.running: list[Req] = []
        self.chunked: Req | None = None  # the request mid-chunk (holds a row, not running)
        self._pending: list[ReqOutput] = []
        self._last_extend = False
        #: Called with each request that finishes by stop or length, before its KV is
        #: released (a disaggregated prefill worker copies the prompt's KV out here).
        self.on_finished: Callable[[Req], None] | None = None
        size = args.chunked_prefill_size
        self.step_prefill_tokens = min(size, args.max_prefill_tokens) if size > 0 else None
        self.clock = clock
        self.intake = Intake(self, args.random_seed)  # checks requests before queueing
        self.slo: SLOController | None = None
        if SLOController.enabled(args):
            self.slo = SLOController(args, self.page_size, self._extend_of)

    # ---- queue management -------------------------------------------------------------

    def add_request(
        self, req: Req, session: SessionParams | None = None, pin_key: str | None = None
    ) -> None:
        """Queue a validated request; with `session`, as a turn of that session (its
        prompt becomes the continued turn's sequence + `req.input_ids`, `sessions.py`);
        with `pin_key`, its sequence is pinned under that key when it finishes.

        Raises:
            InvalidRequestError: an unknown session or turn (HTTP 400).
            RequestTooLargeError: prompt + max_new_tokens can never fit the KV pool or
                the context (HTTP 400).
            QueueFullError: the waiting queue already holds max_queued_requests (HTTP 503).
            SLOUnattainableError: its TTFT target cannot be met behind the queue and
                --slo-admission is reject (HTTP 429).
        """
        job = self.intake.accept(req, session, pin_key)
        if job is None:
            self.waiting.append(req)
        else:
            self.compiling.append((req, job))

    def _extend_of(self, req: Req) -> int:
        """Prompt tokens a waiting request would compute now (its uncached suffix)."""
        return req.seq_len - match_len(self.tree, req)

    def check_fits(self, prompt_len: int, max_new_tokens: int) -> None:
        """Raise RequestTooLargeError unless the prompt fits the context and prompt +
        max_new_tokens (capped by the context) fits the whole KV pool."""
        self.kv.check_fits(prompt_len, max_new_tokens)

    def abort(self, rid: str) -> bool:
        """Stop request `rid` wherever it is (waiting, mid-chunk, decoding); its row and
        slots are freed and its cache path unlocked at once. Returns whether it was found;
        the abort event comes out of the next `step()`."""
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                self._finish(req, FinishReason.ABORT, release=False)
                return True
        for item in self.compiling:
            if item[0].rid == rid:
                self.compiling.remove(item)
                self._finish(item[0], FinishReason.ABORT, release=False)
                return True
        if self.chunked is not None and self.chunked.rid == rid:
            req, self.chunked = self.chunked, None
            self._finish(req, FinishReason.ABORT)
            return True
        for req in self.running:
            if req.rid == rid:
                self.running.remove(req)
                self._finish(req, FinishReason.ABORT)
                return True
        return False

    # ---- one iteration ----------------------------------------------------------------

    def has_work(self) -> bool:
        """Whether `step()` would run a forward or return outputs (requests running,
        waiting or mid-chunk, or abort events not yet returned). Requests whose grammar
        is still compiling (`compiling`) are not work yet: a loop that has no other work
        calls `step()` now and then to let them in."""
        return bool(self.running or self.waiting or self.chunked is not None or self._pending)

    def step(self) -> list[ReqOutput]:
        """Run one extend or decode step; return the outputs of every request it touched
        (plus abort events since the last step). Returns [] at once when idle."""
        mixed = self.args.enable_mixed_chunk
        prefer_decode = self._last_extend and self.running and not mixed
        if self.compiling:
            for req in self.intake.admit_compiled():  # its grammar did not compile
                self._finish(req, FinishReason.ABORT, release=False)
        plan = [] if prefer_decode else self._plan_extend()
        start = self.clock()
        if plan:
            decodes = list(self.running) if mixed else []
            outputs = self._extend(plan, decodes)
            shape = (sum(n for _, n in plan), len(decodes))
        elif self.running:
            self.retractor.make_room_for_decode()
            shape = (0, len(self.running))
            outputs = self._decode(list(self.running))
        else:
            outputs, self._pending = self._pending, []
            shape = None
        if self.slo is not None and shape is not None:
            self.slo.observe(*shape, self.clock() - start)
        self._last_extend = bool(plan)
        return outputs

    def _plan_extend(self) -> Plan:
        """Continue the chunked request, then admit waiting requests in policy order."""
        can_admit = bool(self.waiting) and self.req_pool.available() > 0
        if self.chunked is None and not can_admit:
            return []  # nothing to plan: skip the budgets (a loop over the running requests)
        if self.args.enable_mixed_chunk and self.running:
            self.retractor.make_room_for_decode()  # decodes ride along in this extend step
        rem = self.step_prefill_tokens or self.args.max_prefill_tokens
        if self.slo is not None:
            rem = self.slo.choose_budget(self.running, self.clock())
        c = self.chunked
        if c is not None:
            chunk = self.kv.pages(c.kv_len, min(c.seq_len - c.kv_len, rem)) * self.page_size
            if chunk > self.kv.room():
                self.retractor.retract(c)  # decodes took its room; it resumes from the cache
        budget = self.allocator.available() - self.kv.reserved_tokens(self.running, self.chunked)
        if self.args.enable_mixed_chunk:
            budget -= self.kv.decode_tokens(self.running)
        adder = PrefillAdder(
            self.tree,
            self.page_size,
            rem,
            budget,
            chunking=self.step_prefill_tokens is not None or self.slo is not None,
        )
        if self.chunked is not None and not adder.add_chunked(self.chunked):
            return adder.plan
        self.chunked = None
        if not can_admit:
            return adder.plan
        order = by_priority(self.policy.order(self.waiting))
        if self.slo is not None:
            ahead = sum(n for _, n in adder.plan)
            order = self.slo.order(order, self.clock(), rem, len(self.running), ahead)
        for req in order:
            if self.req_pool.available() == 0:
                break
            added, match = adder.try_add(req, self.kv.estimate(req))
            if added is Added.STOP:
                break
            if added is Added.YES:
                self.waiting.remove(req)
                start_request(req, match, self.kv, self.counters)
        self.chunked = adder.chunked
        if not adder.plan and not self.running and self.chunked is None:
            self.pins.release_oldest()  # only pins keep the waiting requests out: free one
        return adder.plan

    def _extend(self, plan: Plan, decodes: list[Req]) -> list[ReqOutput]:
        """An extend step: the planned prefill chunks (decodes ride along in mixed steps).
        Commits its result, then caches the prefilled prompts (or chunks)."""
        batch = [r for r, _ in plan] + decodes
        try:
            result = self.forward_step.run(plan, decodes)
        except Exception:
            self._fail(batch)
            raise
        c = self.counters
        c.decode_tokens += result.decode_tokens
        c.extend_steps += 1
        c.prefill_tokens += sum(n for _, n in plan)
        outputs = self._commit(result)
        for req, _ in plan:  # cache prefilled prompts (or chunks) so later chunks and requests hit
            if req.finish_reason is None:
                self.kv.cache_running(req)
        if logger.isEnabledFor(logging.DEBUG):
            tokens = sum(n for _, n in plan)
            logger.debug(
                "extend: %d reqs, %d tokens; %s", len(plan), tokens, format_stats(self.stats())
            )
        return outputs

    def _decode(self, reqs: list[Req]) -> list[ReqOutput]:
        """A decode step over the running requests `reqs` by the decode strategy; the
        scheduler aborts the batch when the strategy raises, and commits its result."""
        try:
            result = self.decoder.decode(self._decode_ctx, reqs)
        except Exception:
            self._fail(reqs)
            raise
        c = self.counters
        c.decode_tokens += result.decode_tokens
        c.decode_steps += 1
        self.ratio.on_decode_step()
        if c.decode_steps % 100 == 0:
            logger.info("decode: %s", format_stats(self.stats()))
        return self._commit(result)

    def _after_forward(self, fb, batch: list[Req], next_ids: dict[Req, int]) -> None:
        """Tell the decode strategy (whichever is set now) about a forward this ran."""
        self.decoder.after_forward(fb, batch, next_ids)

    def _plain_decode(self, reqs: list[Req]) -> DecodeResult:
        """The plain decode step (`DecodeContext.plain_decode`): one token per request."""
        return self.forward_step.run([], reqs)

    def _fail(self, batch: list[Req]) -> None:
        """A step raised: abort its requests and free their slots without caching them
        (their KV may be partly written)."""
        logger.exception("step failed; aborting %d requests", len(batch))
        for req in batch:
            if req in self.running:
                self.running.remove(req)
            if req is self.chunked:
                self.chunked = None
            self.kv.discard(req)
            req.finish_reason = FinishReason.ABORT
            self.sessions.finished(req)
            self.counters.aborted += 1
            self._pending.append(req.step_output([]))

    # ---- outputs ------------------------------------------------------------------------

    def _commit(self, result: DecodeResult) -> list[ReqOutput]:
        """Apply a step's result to the scheduler: the pending abort events come first,
        then one output per stepped request; finished requests leave `running` (their KV
        goes to the cache), the others run on (stepped ones after the rest)."""
        outputs, self._pending = self._pending, []
        now = self.clock()
        still_running = [r for r in self.running if r not in result.reqs]
        for req, ids, reason, lp in zip(
            result.reqs, result.new_ids, result.reasons, result.logprobs
        ):
            if ids and req.first_token_time < 0:
                req.first_token_time = now
            if reason is None:
                still_running.append(req)
                outputs.append(req.step_output(ids, lp))
            else:
                outputs.append(self._finish(req, reason, new_ids=ids, logprobs=lp))
        self.running = still_running
        return outputs

    def _finish(
        self, req: Req, reason: FinishReason, new_ids=(), release: bool = True, logprobs=None
    ) -> ReqOutput:
        req.finish_reason = reason
        if self.on_finished is not None and reason is not FinishReason.ABORT:
            self.on_finished(req)
        if release:
            self.kv.release(req)
        self.sessions.finished(req)  # after release: a pin locks the sequence just cached
        out = req.step_output(list(new_ids), logprobs)
        if reason is FinishReason.ABORT:
            self.counters.aborted += 1
            self._pending.append(out)
        elif self.slo is not None:
            self.slo.on_finish(req, self.clock())
        return out

    def add_prefilled(self, req: Req, first_token: int) -> None:
        """Run on a request whose prompt KV another worker computed: `req` holds its row
        and kv_len == len(input_ids) (cached as a running request); `first_token` is the
        token that worker sampled. It is appended and checked for a stop here; its output
        comes out of the next `step()`, and the request decodes on unless it finished. Its
        prompt and `req.cached_tokens` count in the hit-rate counters as a local prefill's."""
        self.counters.prompt_tokens += len(req.input_ids)
        self.counters.cached_tokens += req.cached_tokens
        req.output_ids.append(first_token)
        reason = self.stop.check(req, first_token)
        if reason is None:
            self.running.append(req)
            self._pending.append(req.step_output([first_token]))
        else:
            self._pending.append(self._finish(req, reason, new_ids=[first_token]))

    # ---- introspection ------------------------------------------------------------------

    def memory_accounting(self) -> dict[str, int]:
        """Token counts: free + evictable + protected + held == total (checked in tests)."""
        return self.kv.accounting(self.running, self.chunked, self.pins.pinned_tokens())

    def stats(self) -> dict[str, int | float | str]:
        """Counters, pool accounting and token usage (`stats.py::scheduler_stats`)."""
        return scheduler_stats(self)
