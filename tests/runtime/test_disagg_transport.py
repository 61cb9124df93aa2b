"""The gloo KV transport (runtime/disagg/transport.py) between two threads of one
process: bytes arrive intact, refusals and dead peers surface as TransferError, and a
sender rebuilds its link after a failure."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from radixlm.runtime.disagg.transport import (
    GlooReceiver,
    GlooSender,
    KVLayout,
    TransferError,
    TransferMeta,
    kv_tensor,
)

LAYOUT = KVLayout("smollm2-135m", 2, 3, 4, "torch.bfloat16", 1)


def _meta(room: int, kv: torch.Tensor, layout: KVLayout = LAYOUT) -> TransferMeta:
    n = kv.shape[1]
    return TransferMeta(
        room=room,
        layout=layout,
        input_ids=list(range(n)),
        first_token=7,
        seed=11,
        kv_shape=list(kv.shape),
    )


def test_transfer_round_trip_and_refusal():
    got = []

    def on_transfer(meta, raw):
        reason = LAYOUT.mismatch(meta.layout)
        if reason is None:
            got.append((meta, kv_tensor(meta, raw).clone()))
        return reason

    receiver = GlooReceiver("127.0.0.1", 0, 10.0)
    receiver.start(on_transfer)
    sender = GlooSender("127.0.0.1", receiver.port, 10.0)
    kv = torch.randn(4, 5, 3, 4).to(torch.bfloat16)
    sender.send(_meta(1, kv), kv)
    meta, received = got[0]
    assert torch.equal(received, kv)
    assert (meta.room, meta.first_token, meta.seed, meta.input_ids) == (1, 7, 11, [0, 1, 2, 3, 4])

    other = KVLayout("other", 2, 3, 8, "torch.float32", 1)
    wide = torch.zeros(4, 2, 3, 8)
    with pytest.raises(TransferError) as e:
        sender.send(_meta(2, wide, other), wide)
    assert str(e.value) == (
        "the decode worker refused the KV: model_path: sent 'other', expected "
        "'smollm2-135m'; head_dim: sent 8, expected 4; dtype: sent 'torch.float32', "
        "expected 'torch.bfloat16'"
    )
    sender.send(_meta(3, kv), kv)  # a refusal leaves the link usable
    assert [m.room for m, _ in got] == [1, 3]


def test_dead_or_silent_peer_is_a_transfer_error_and_the_link_is_rebuilt():
    release = threading.Event()
    calls = []

    def on_transfer(meta, raw):
        calls.append(meta.room)
        if meta.room == 1:
            release.wait(10)  # never acknowledges within the sender's timeout
        return None

    receiver = GlooReceiver("127.0.0.1", 0, 10.0)
    receiver.start(on_transfer)
    sender = GlooSender("127.0.0.1", receiver.port, 1.0)
    kv = torch.ones(4, 2, 3, 4, dtype=torch.bfloat16)
    start = time.monotonic()
    with pytest.raises(TransferError, match=f"KV transfer to 127.0.0.1:{receiver.port} failed"):
        sender.send(_meta(1, kv), kv)
    assert time.monotonic() - start < 5
    release.set()
    sender.send(_meta(2, kv), kv)  # a new link (peer 1)
    assert calls == [1, 2]

    nobody = GlooSender("127.0.0.1", 1, 1.0)
    with pytest.raises(TransferError, match="KV transfer to 127.0.0.1:1 failed"):
        nobody.send(_meta(3, kv), kv)
