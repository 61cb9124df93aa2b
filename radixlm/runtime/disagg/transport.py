"""KV transfer between a prefill worker and a decode worker, behind one interface.

A transfer is one `TransferMeta` (msgpack) and one KV tensor (raw bytes) from the prefill
side to the decode side, answered by an acknowledgement: accepted, or refused with a
reason (a layout mismatch, a prompt that does not match). `KVSender.send` returns once
the decode side has the bytes and accepted them, or raises `TransferError`.

The engine here is torch.distributed point-to-point over gloo on CPU tensors (the
prefill side copies KV to the CPU first, `kv_pages.gather`, so a GPU pool sends through
it too; an NCCL or RDMA engine would implement the same two classes).

Bootstrap: the decode worker hosts a `torch.distributed.TCPStore` on
``--disaggregation-bootstrap-port``; each prefill worker that first sends to it takes a
peer number ``n`` from the store's counter and both sides build a two-rank
`ProcessGroupGloo` under the store prefix ``peer/<n>/`` (prefill rank 0, decode rank 1).
A link that fails is dropped; the next send builds a new one.

Wire (tag 0, in order): int64[2] header (meta bytes, KV bytes); the meta bytes; the KV
bytes; then decode -> prefill int64[2] (status 0 ok / 1 refused, reason bytes) and the
reason bytes when there are any.
"""

from __future__ import annotations

import abc
import datetime
import logging
import threading
from collections.abc import Callable

import msgspec
import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

# A decode link waits this long for the next transfer's header (a prefill worker may be
# idle for a long time; a dead one closes the socket, which ends the wait at once).
_IDLE_WAIT = datetime.timedelta(days=7)


class TransferError(RuntimeError):
    """A KV transfer did not complete: the link failed or timed out, or the decode side
    refused it (the message says which)."""


class KVLayout(msgspec.Struct, frozen=True):
    """What a KV tensor means: the decode side accepts KV only from an equal layout.

    model_path: the served model (path or registry name). num_layers, num_kv_heads,
    head_dim: the pool's buffers [slots, num_kv_heads, head_dim] per layer (K then V).
    dtype: the pool's storage dtype (e.g. "torch.bfloat16"). page_size: tokens per page.
    """

    model_path: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int

    def mismatch(self, other: KVLayout) -> str | None:
        """A message naming every field where `other` (the sender's) differs from this
        layout (the receiver's), or None when they are equal."""
        diffs = [
            f"{f}: sent {getattr(other, f)!r}, expected {getattr(self, f)!r}"
            for f in self.__struct_fields__
            if getattr(self, f) != getattr(other, f)
        ]
        return "; ".join(diffs) or None


class TransferMeta(msgspec.Struct, kw_only=True):
    """What the decode side needs to continue a prefilled request.

    room: the request's bootstrap room (pairs the transfer with the decode request).
    layout: the sender's `KVLayout`. input_ids: the prompt whose KV is sent (tokens).
    first_token: the token the prefill sampled. seed: the sampling seed the prefill drew
    with (draws depend on seed and output position only). kv_shape: the KV tensor's
    shape [2 * num_layers, len(input_ids), num_kv_heads, head_dim] (K layers, V layers).
    """

    room: int
    layout: KVLayout
    input_ids: list[int]
    first_token: int
    seed: int
    kv_shape: list[int]


_meta_encoder = msgspec.msgpack.Encoder()
_meta_decoder = msgspec.msgpack.Decoder(TransferMeta)

# Called by a receiver for each transfer with its meta and raw KV bytes (uint8; see
# `kv_tensor`): returns None to accept, or the refusal reason.
OnTransfer = Callable[[TransferMeta, torch.Tensor], "str | None"]


def kv_tensor(meta: TransferMeta, raw: torch.Tensor) -> torch.Tensor:
    """The received bytes `raw` (uint8) as the KV tensor meta.kv_shape of dtype
    meta.layout.dtype. Raises ValueError when they do not fit."""
    dtype = getattr(torch, meta.layout.dtype.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown KV dtype {meta.layout.dtype!r}")
    try:
        return raw.view(dtype).view(meta.kv_shape)
    except RuntimeError as e:
        raise ValueError(f"{raw.numel()} KV bytes do not fit shape {meta.kv_shape}: {e}") from e


class KVSender(abc.ABC):
    """The prefill side of one decode worker's link."""

    @abc.abstractmethod
    def send(self, meta: TransferMeta, kv: torch.Tensor) -> None:
        """Send `meta` and `kv` (shape meta.kv_shape, dtype meta.layout.dtype, CPU) and
        wait for the acknowledgement. Raises TransferError (failed, timed out, refused)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Drop the link."""


class KVReceiver(abc.ABC):
    """The decode side: accepts links and hands each transfer to `on_transfer`."""

    @abc.abstractmethod
    def start(self, on_transfer: OnTransfer) -> None:
        """Start receiving on background threads."""


def _wait(work, timeout: datetime.timedelta) -> None:
    if not work.wait(timeout):
        raise TimeoutError(f"no completion within {timeout.total_seconds():g} s")


def _bytes_of(kv: torch.Tensor) -> torch.Tensor:
    return kv.contiguous().view(-1).view(torch.uint8)


class GlooSender(KVSender):
    """`KVSender` over torch.distributed gloo to the decode worker at host:port.

    timeout: seconds for connecting and for each step of a transfer (connect, header,
    metadata, KV, acknowledgement: each waits at most this long)."""

    def __init__(self, host: str, port: int, timeout: float):
        self.host, self.port = host, port
        self.timeout = datetime.timedelta(seconds=timeout)
        self._pg = None
        self._lock = threading.Lock()

    def _connect(self):
        store = dist.TCPStore(self.host, self.port, is_master=False, timeout=self.timeout)
        peer = store.add("peers", 1) - 1
        store.set(f"peer/{peer}", "1")
        prefixed = dist.PrefixStore(f"peer/{peer}/", store)
        return dist.ProcessGroupGloo(prefixed, 0, 2, self.timeout)

    def send(self, meta: TransferMeta, kv: torch.Tensor) -> None:
        meta_bytes = torch.frombuffer(bytearray(_meta_encoder.encode(meta)), dtype=torch.uint8)
        payload = _bytes_of(kv)
        header = torch.tensor([meta_bytes.numel(), payload.numel()], dtype=torch.int64)
        with self._lock:
            try:
                if self._pg is None:
                    self._pg = self._connect()
                pg = self._pg
                for t in (header, meta_bytes, payload):
                    _wait(pg.send([t], 1, 0), self.timeout)
                ack = torch.zeros(2, dtype=torch.int64)
                _wait(pg.recv([ack], 1, 0), self.timeout)
                reason = ""
                if int(ack[1]) > 0:
                    buf = torch.empty(int(ack[1]), dtype=torch.uint8)
                    _wait(pg.recv([buf], 1, 0), self.timeout)
                    reason = bytes(buf.numpy()).decode()
            except Exception as e:  # the link is in an unknown state: rebuild it next time
                self.close()
                raise TransferError(
                    f"KV transfer to {self.host}:{self.port} failed: {type(e).__name__}: {e}"
                ) from e
        if int(ack[0]) != 0:
            raise TransferError(f"the decode worker refused the KV: {reason}")

    def close(self) -> None:
        self._pg = None


class GlooReceiver(KVReceiver):
    """`KVReceiver` over torch.distributed gloo: hosts the bootstrap store on host:port.

    timeout: seconds for a link's set-up and for the rest of a transfer once its header
    arrived. Raises (from the constructor) when the port cannot be bound."""

    def __init__(self, host: str, port: int, timeout: float):
        self.timeout = datetime.timedelta(seconds=timeout)
        self.store = dist.TCPStore(
            host, port, is_master=True, wait_for_workers=False, timeout=self.timeout
        )
        self.host, self.port = host, self.store.port

    def start(self, on_transfer: OnTransfer) -> None:
        threading.Thread(
            target=self._accept, args=(on_transfer,), name="kv-accept", daemon=True
        ).start()

    def _accept(self, on_transfer: OnTransfer) -> None:
        peer = 0
        while True:
            try:
                self.store.wait([f"peer/{peer}"], _IDLE_WAIT)
            except Exception:  # the store's wait timed out: keep waiting
                continue
            threading.Thread(
                target=self._serve, args=(peer, on_transfer), name=f"kv-peer-{peer}", daemon=True
            ).start()
            peer += 1

    def _serve(self, peer: int, on_transfer: OnTransfer) -> None:
        try:
            # A store client of its own: one client's calls are serialized, and the accept
            # thread blocks in `wait` on the master's.
            client = dist.TCPStore(self.host, self.port, is_master=False, timeout=self.timeout)
            prefixed = dist.PrefixStore(f"peer/{peer}/", client)
            pg = dist.ProcessGroupGloo(prefixed, 1, 2, self.timeout)
            while True:
                header = torch.zeros(2, dtype=torch.int64)
                _wait(pg.recv([header], 0, 0), _IDLE_WAIT)
                meta_buf = torch.empty(int(header[0]), dtype=torch.uint8)
                kv_buf = torch.empty(int(header[1]), dtype=torch.uint8)
                _wait(pg.recv([meta_buf], 0, 0), self.timeout)
                _wait(pg.recv([kv_buf], 0, 0), self.timeout)
                reason = self._deliver(meta_buf, kv_buf, on_transfer)
                encoded = (reason or "").encode()
                ack = torch.tensor([int(reason is not None), len(encoded)], dtype=torch.int64)
                _wait(pg.send([ack], 0, 0), self.timeout)
                if encoded:
                    msg = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)
                    _wait(pg.send([msg], 0, 0), self.timeout)
        except Exception as e:  # the prefill side went away or broke the protocol
            logger.info("KV link %d closed: %s: %s", peer, type(e).__name__, e)

    @staticmethod
    def _deliver(meta_buf, kv_buf, on_transfer: OnTransfer) -> str | None:
        try:
            meta = _meta_decoder.decode(bytes(meta_buf.numpy()))
        except msgspec.DecodeError as e:
            return f"malformed transfer metadata: {e}"
        return on_transfer(meta, kv_buf)
