"""A simulated serving engine for the echo executor: what a model replica costs, without a model.

Routing and autoscaling are about queues and caches, not arithmetic, so benchmarks of them
can run more replicas than this machine holds model copies. Per replica:

- **prefill** runs one request at a time (a FIFO lock: requests queue behind it, as behind a
  busy prefill in vLLM or our JAX engine) and takes ``prefill_s_per_token`` per prompt token
  that is not served from the replica's prefix cache;
- the **prefix cache** holds ``cache_blocks`` blocks of ``block_tokens`` prompt words, keyed by
  the tenant and everything up to the block's end, least recently used evicted first;
- **decode** takes ``token_delay_s`` per token, slowed by ``batch_slowdown`` for every other
  request decoding at the same time (a batch step costs more the larger the batch);
- **start** takes ``startup_s`` (loading the weights), so a new replica has a cold start.

``state()`` reports what a real engine would: queue depth, outstanding requests and tokens
(uncached prompt plus the tokens left to generate), cache blocks used.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence

import attrs


@attrs.frozen(kw_only=True)
class CostOptions:
    """The cost-model part of ``echo``'s options (all off by default)."""

    prefill_s_per_token: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0), metadata={
        "help": "simulated prefill time per uncached prompt token; prefills run one at a time"})
    cache_blocks: int = attrs.field(default=0, validator=attrs.validators.ge(0), metadata={
        "help": "simulated prefix-cache capacity, in blocks (0: no cache)"})
    block_tokens: int = attrs.field(default=16, validator=attrs.validators.ge(1), metadata={
        "help": "prompt words per simulated cache block"})
    batch_slowdown: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0), metadata={
        "help": "each other decoding request slows a token by this fraction of token_delay_s"})
    startup_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0), metadata={
        "help": "simulated model-load time: start() takes this long (cold starts for autoscaling)"})


class SimulatedEngine:
    """One replica's prefill queue, prefix cache and decode batch."""

    def __init__(self, options: CostOptions) -> None:
        self.options = options
        self._prefill = asyncio.Lock()
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.waiting = 0
        self.decoding = 0
        self.outstanding_tokens = 0

    def _keys(self, tenant: str, words: Sequence[str]) -> list[bytes]:
        size, digest, keys = self.options.block_tokens, hashlib.blake2b(tenant.encode(), digest_size=16), []
        for end in range(size, len(words) + 1, size):
            digest.update("".join(words[end - size:end]).encode())
            keys.append(digest.copy().digest())
        return keys

    async def prefill(self, tenant: str, words: Sequence[str]) -> tuple[int, float]:
        """Wait for the prefill slot, then 'compute' the uncached part; returns (cached tokens, queue seconds)."""
        keys = self._keys(tenant, words) if self.options.cache_blocks else []
        self.waiting += 1
        began = time.monotonic()
        try:
            await self._prefill.acquire()
        finally:
            self.waiting -= 1
        queued = time.monotonic() - began
        try:
            hits = 0
            for key in keys:
                if key not in self._blocks:
                    break
                self._blocks.move_to_end(key)
                hits += 1
            cached = hits * self.options.block_tokens
            await asyncio.sleep((len(words) - cached) * self.options.prefill_s_per_token)
            for key in keys[hits:]:
                self._blocks[key] = None
            while len(self._blocks) > self.options.cache_blocks:
                self._blocks.popitem(last=False)
            return cached, queued
        finally:
            self._prefill.release()

    def token_delay(self, base_s: float) -> float:
        return base_s * (1 + self.options.batch_slowdown * max(self.decoding - 1, 0))

    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)
