"""vLLM's prefix-cache block hashes, computed in the gateway from a prompt's token ids.

vLLM (0.32, v1 engine) keys each full block of `block_size` tokens by a hash of (the parent
block's hash, the block's tokens as a tuple, extra keys), chained from a seed hash NONE_HASH:
`hash_block_tokens` in vllm/v1/core/kv_cache_utils.py. The hash function is the engine's
`--prefix-caching-hash-algo`: `sha256` (the default: SHA-256 of the pickled tuple) or
`sha256_cbor` (SHA-256 of canonical CBOR). NONE_HASH is that function applied to the seed string:
the engine's PYTHONHASHSEED if set, else "vllm-none-hash". KV events carry the low 64 bits of each
32-byte digest as an int (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, on by default), which is what the
index stores; the chain itself runs on full digests.

Only `sha256` and `sha256_cbor` are supported: vLLM seeds the xxhash variants with random bytes
per process unless PYTHONHASHSEED is set, so nothing outside the engine can reproduce them.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any, Literal

HashAlgo = Literal["sha256", "sha256_cbor"]
DEFAULT_SEED = "vllm-none-hash"
_MASK64 = (1 << 64) - 1


def _sha256_pickle(obj: Any) -> bytes:
    # Protocol 5 is pickle.HIGHEST_PROTOCOL on every Python vLLM 0.32 supports (3.10-3.13).
    return hashlib.sha256(pickle.dumps(obj, protocol=5)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    import cbor2  # a dependency of vLLM; only this algorithm needs it

    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


_ALGOS: dict[str, Callable[[Any], bytes]] = {"sha256": _sha256_pickle,
                                              "sha256_cbor": _sha256_cbor}


def external(digest: bytes) -> int:
    """The int a KV event carries for a block hash: the digest's low 64 bits, big-endian."""
    return int.from_bytes(digest, "big") & _MASK64


class BlockHasher:
    """The block hashes of a token sequence, as one engine configuration computes them."""

    __slots__ = ("_fn", "_none")

    def __init__(self, algo: HashAlgo = "sha256", seed: str = DEFAULT_SEED) -> None:
        self._fn = _ALGOS[algo]
        self._none = self._fn(seed)

    def hashes(self, tokens: Sequence[int], block_size: int, max_blocks: int,
               extra: tuple[Any, ...] | None = None) -> list[int]:
        """The external (64-bit) hash of each full block of `tokens`, at most `max_blocks`.

        `extra` is the per-block extra key tuple (vLLM tags a LoRA adapter as
        ("lora", name, path)); the same for every block here (no multimodal, no cache_salt)."""
        n = min(len(tokens) // block_size, max_blocks)
        fn = self._fn
        parent = self._none
        out: list[int] = []
        for i in range(0, n * block_size, block_size):
            parent = fn((parent, tuple(tokens[i:i + block_size]), extra))
            out.append(int.from_bytes(parent[-8:], "big"))
        return out
