"""Digests of raw bytes, taken at every optimizer step: they must cost a few percent of a step, not a step.

A tensor's bytes are read as 64-bit words w_i and reduced to sum(w_i * k_i) mod 2**64, with k_i fixed odd
pseudo-random keys (a multilinear hash): one numpy dot per 8 MiB chunk, chunk results weighted by their
index. Any change of one word changes the sum (an odd key is invertible mod 2**64); two runs whose state
drifted apart collide with probability about 2**-64 per piece. It is not a cryptographic hash, and needs
not be: nobody forges a training run's state. sha1 of the same bytes runs at a quarter of the speed
(bench section i). Small things (RNG states, Python objects) go through sha1.
"""

import hashlib
import random

import numpy as np

CHUNK_WORDS = 1 << 20  # 8 MiB of 64-bit words per dot
_KEYS = np.random.default_rng(0x5EED_CE27).integers(0, 2**64, CHUNK_WORDS, dtype=np.uint64,
                                                     endpoint=False) | np.uint64(1)
_GOLDEN = 0x9E3779B97F4A7C15  # weights each chunk's sum by its index (odd, so no chunk cancels)


def short(h) -> str:
    return h.hexdigest()[:16]


def words_digest(raw: np.ndarray) -> int:
    """sum(w_i * k_i) mod 2**64 over the bytes RAW (uint8, padded to whole words)."""
    pad = -raw.size % 8
    if pad:
        raw = np.concatenate([raw, np.zeros(pad, np.uint8)])
    words, total = raw.view(np.uint64), 0
    for j, start in enumerate(range(0, words.size, CHUNK_WORDS)):
        chunk = words[start:start + CHUNK_WORDS]
        total += int(np.dot(chunk, _KEYS[:chunk.size])) * ((j * _GOLDEN + 1) | 1)  # numpy's uint64 dot wraps
    return total % 2**64


def tensor_bytes(t) -> np.ndarray:
    """A tensor's raw bytes as uint8 (its local shard for a DTensor; copied to the host for a device)."""
    import torch

    t = t.detach()
    if hasattr(t, "to_local"):
        t = t.to_local()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)


def readable(t) -> bool:
    """Whether T holds data: not on the meta device, not a FakeTensor (a shape-only tensor of tracing)."""
    import torch

    if t.device.type == "meta":
        return False
    if type(t) in (torch.Tensor, torch.nn.Parameter):
        return True
    from torch._subclasses.fake_tensor import FakeTensor

    return not isinstance(t, FakeTensor)


def tensor_line(t) -> bytes:
    """A tensor's layout and the digest of its bytes; a tensor whose bytes cannot be read (on the meta device,
    fake, a subclass without plain storage), by its kind alone."""
    try:
        if readable(t):
            return f"{t.dtype}{list(t.shape)}:{words_digest(tensor_bytes(t)):016x};".encode()
    except Exception:  # noqa: BLE001  (a subclass whose bytes are not a plain view: described, not read)
        pass
    return f"{t.dtype}{list(t.shape)}:unreadable {type(t).__name__} on {t.device.type};".encode()


def of_tensors(tensors) -> str:
    """One digest of an ordered sequence of tensors (None where a tensor is absent, as a missing gradient)."""
    h = hashlib.sha1()
    for t in tensors:
        h.update(b"None;" if t is None else tensor_line(t))
    return short(h)


def of_object(obj) -> str:
    """A digest of a batch as a model received it: tensors by their bytes, containers walked, plain values by
    repr, any other object by its type's name (never its address)."""
    h = hashlib.sha1()
    _walk(obj, h.update)
    return short(h)


def _walk(obj, update) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        update(tensor_line(obj))
    elif isinstance(obj, dict):
        for key in sorted(obj, key=repr):
            update(repr(key).encode() + b"=")
            _walk(obj[key], update)
    elif isinstance(obj, (list, tuple)):
        update(b"[")
        for item in obj:
            _walk(item, update)
        update(b"]")
    elif isinstance(obj, (int, float, str, bool, bytes, type(None))):
        update(repr(obj).encode() + b";")
    elif isinstance(obj, np.ndarray):
        update(f"{obj.dtype}{list(obj.shape)}".encode() + hashlib.sha1(np.ascontiguousarray(obj).tobytes()).digest())
    else:
        update(type(obj).__qualname__.encode() + b";")


def rng_states() -> dict:
    """Digests of the global RNGs a training step may draw from: torch's, numpy's, Python's, and CUDA's once
    CUDA is in use. Reading a state draws nothing."""
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state()
    found = {"rng_torch": short(hashlib.sha1(torch.get_rng_state().numpy().tobytes())),
             "rng_numpy": short(hashlib.sha1(keys.tobytes() + repr((name, pos, has_gauss, cached)).encode()))}
    found["rng_python"] = short(hashlib.sha1(repr(random.getstate()).encode()))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        found["rng_cuda"] = short(hashlib.sha1(b"".join(s.numpy().tobytes() for s in torch.cuda.get_rng_state_all())))
    return found
