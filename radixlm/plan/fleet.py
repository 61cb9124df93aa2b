"""Fleet sizing: replicas and nodes for a request rate, length distribution and SLO pair.

The sizing chain, per tensor-parallel degree (each step is printed by `plan fleet`):
 1. Lengths: prompt and output lengths are discrete distributions ("len:weight,...");
    means drive throughput, the longest prompt drives the TTFT check.
 2. Memory: KV capacity of one replica (`radixlm.plan.capacity`); each running sequence
    may hold up to P_mean + O_mean tokens, so B_mem = tokens / (P_mean + O_mean).
 3. Prefill cost per request: t_p = E[t_prefill(P (1 - h))] over the prompt distribution
    (h = prefix-cache hit rate: cached tokens are read, not recomputed).
 4. Decode batch: a colocated replica time-shares prefill and decode. At arrival rate
    lambda_r it spends lambda_r t_p of each second in prefill, and by Little's law it holds
    B = lambda_r * O * TPOT requests in decode. Solving both gives the throughput
        lambda_r = B / (O t_d(B) + B t_p)          [req/s]
    and the TPOT users see, TPOT = t_d(B) + B t_p / O: each output token waits for its
    decode step plus its share of the prefills admitted meanwhile. The largest B with
    TPOT <= SLO and B <= B_mem is found by bisection (TPOT grows with B).
 5. TTFT: the longest prompt's prefill must fit the TTFT SLO: t_prefill(P_max) <= TTFT.
 6. Replicas: run each at a target utilization u < 1 to keep queueing delay bounded
    (queueing theory: the mean wait of an M/G/1 queue grows like u / (1 - u)),
        replicas = ceil(lambda / (u * lambda_r)).
 7. Hardware: GPUs = replicas * tp; nodes = ceil(replicas / floor(gpus_per_node / tp)),
    or replicas * ceil(tp / gpus_per_node) when one replica spans several nodes.
The TP degree with the fewest GPUs (then the smallest TP) is chosen. Step times come
from the roofline model (`radixlm.plan.cost`), so the answer is a lower bound on
hardware: scale `--flops-eff` / `--bw-eff` to what your kernels achieve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from radixlm.plan.capacity import capacity
from radixlm.plan.cost import Deployment
from radixlm.plan.lengths import LengthDist
from radixlm.plan.validate import FRACTION, POSITIVE, POSITIVE_INT, PROBABILITY


@dataclass
class FleetPlan:
    tp: int
    feasible: bool
    reason: str
    replicas: int = 0
    gpus: int = 0
    nodes: int = 0
    decode_batch: int = 0
    replica_rps: float = 0.0
    tpot_ms: float = 0.0
    ttft_ms: float = 0.0
    chain: list[dict] = field(default_factory=list)


def _prefill_s(dep: Deployment, prompt: int, hit: float) -> float:
    cached = int(prompt * hit)
    new = max(1, prompt - cached)
    return dep.step(chunk=new, chunk_prefix=cached).time_s


def plan_replica(
    dep: Deployment,
    *,
    rate: float,
    prompt: LengthDist,
    output: LengthDist,
    ttft_slo_ms: float,
    tpot_slo_ms: float,
    utilization: float = 0.8,
    gpus_per_node: int = 8,
    prefix_hit: float = 0.0,
    mem_fraction: float = 0.9,
) -> FleetPlan:
    """Run the sizing chain (module doc) for one deployment (one TP degree).

    Raises:
        ValueError: rate or an SLO <= 0, utilization or mem_fraction outside (0, 1],
            prefix_hit outside [0, 1], or gpus_per_node < 1.
    """
    POSITIVE.check("rate", rate)
    POSITIVE.check("ttft_slo_ms", ttft_slo_ms)
    POSITIVE.check("tpot_slo_ms", tpot_slo_ms)
    FRACTION.check("utilization", utilization)
    FRACTION.check("mem_fraction", mem_fraction)
    PROBABILITY.check("prefix_hit", prefix_hit)
    POSITIVE_INT.check("gpus_per_node", gpus_per_node)
    tp = dep.tp
    chain: list[dict] = []

    def note(step: str, formula: str, value) -> None:
        chain.append({"step": step, "formula": formula, "value": value})

    p_mean, o_mean = prompt.mean, output.mean
    note("lengths", "P_mean, O_mean, P_max", f"{p_mean:,.0f}, {o_mean:,.0f}, {prompt.max:,}")
    seq = math.ceil(p_mean + o_mean)
    cap = capacity(
        dep.model,
        dep.hw,
        tp=tp,
        weight_dtype=dep.weight_dtype,
        kv_dtype=dep.kv_dtype,
        context=seq,
        mem_fraction=mem_fraction,
    )
    note("weights/GPU", "weights / tp", f"{cap.weights_bytes_per_gpu / 1e9:.1f} GB")
    note("KV tokens/replica", "(mem*frac - weights/tp) / kv_per_token_gpu", cap.max_tokens)
    b_mem = cap.max_tokens // seq
    note("B_mem", "tokens / (P_mean + O_mean)", b_mem)
    if b_mem == 0:
        return FleetPlan(tp, False, "weights or one sequence do not fit in memory", chain=chain)
    t_p = sum(
        w * _prefill_s(dep, p, prefix_hit)
        for p, w in zip(prompt.values, prompt.weights, strict=True)
    )
    note("t_prefill mean", "E[t_prefill(P (1 - hit))]", f"{t_p * 1e3:.2f} ms")
    ctx = int(p_mean + o_mean / 2)

    def tpot_s(b: int) -> float:
        return dep.decode(b, ctx).time_s + b * t_p / o_mean

    if tpot_s(1) * 1e3 > tpot_slo_ms:
        note("TPOT at B=1", "t_d(1) + t_p / O", f"{tpot_s(1) * 1e3:.2f} ms")
        return FleetPlan(tp, False, "TPOT SLO missed even at batch 1", chain=chain)
    lo, hi = 1, b_mem
    if tpot_s(hi) * 1e3 <= tpot_slo_ms:
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tpot_s(mid) * 1e3 <= tpot_slo_ms:
            lo = mid
        else:
            hi = mid
    b = lo
    t_d = dep.decode(b, ctx).time_s
    note(
        "decode batch B",
        "max B: t_d(B) + B t_p / O <= TPOT SLO, B <= B_mem",
        f"{b:,} ({'memory' if b == b_mem else 'TPOT'}-limited)",
    )
    note("t_d(B)", f"decode step at B, context {ctx}", f"{t_d * 1e3:.2f} ms")
    tpot = tpot_s(b)
    note("TPOT", "t_d(B) + B t_p / O", f"{tpot * 1e3:.2f} ms")
    rps = b / (o_mean * t_d + b * t_p)
    note("replica throughput", "B / (O t_d + B t_p)", f"{rps:.3f} req/s")
    ttft = _prefill_s(dep, prompt.max, prefix_hit)
    note("TTFT (P_max)", "t_prefill(P_max)", f"{ttft * 1e3:.1f} ms")
    if ttft * 1e3 > ttft_slo_ms:
        return FleetPlan(
            tp,
            False,
            "TTFT SLO missed by the longest prompt's prefill",
            decode_batch=b,
            replica_rps=rps,
            tpot_ms=tpot * 1e3,
            ttft_ms=ttft * 1e3,
            chain=chain,
        )
    replicas = math.ceil(rate / (utilization * rps))
    note("replicas", f"ceil(rate / (u * lambda_r)), u = {utilization}", replicas)
    if tp <= gpus_per_node:
        nodes = math.ceil(replicas / (gpus_per_node // tp))
        how = f"ceil(replicas / floor({gpus_per_node} / tp))"
    else:  # a replica spans several nodes
        nodes = replicas * math.ceil(tp / gpus_per_node)
        how = f"replicas * ceil(tp / {gpus_per_node})"
    note("GPUs", "replicas * tp", replicas * tp)
    note("nodes", how, nodes)
    note(
        "in flight",
        "rate * (TTFT + O * TPOT) (Little's law)",
        f"{rate * (ttft + o_mean * tpot):,.0f} requests",
    )
    note(
        "token rates",
        "rate * P_mean in, rate * O_mean out",
        f"{rate * p_mean:,.0f} in/s, {rate * o_mean:,.0f} out/s",
    )
    return FleetPlan(
        tp, True, "ok", replicas, replicas * tp, nodes, b, rps, tpot * 1e3, ttft * 1e3, chain
    )


def plan_fleet(deps: list[Deployment], **kwargs) -> tuple[FleetPlan | None, list[FleetPlan]]:
    """Size each deployment (one per TP degree); return the best (fewest GPUs, then the
    smallest TP) and all plans. The best is None when no TP degree is feasible."""
    plans = [plan_replica(d, **kwargs) for d in deps]
    ok = [p for p in plans if p.feasible]
    best = min(ok, key=lambda p: (p.gpus, p.tp)) if ok else None
    return best, plans
