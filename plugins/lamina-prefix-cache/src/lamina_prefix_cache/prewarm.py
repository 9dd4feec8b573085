"""The ``recurring`` pre-warm policy: prompt prefixes that recur across requests.

Each observed prompt is walked block by block (``block_size`` token ids, the executor's KV
block) through a per-salt trie, and every node it reaches counts one use, decayed by half
every ``half_life_s``. A node used at least ``min_uses`` times recurs. The wanted prefixes are
the deepest recurring nodes (none of their children recurs) at least ``min_tokens`` long,
most used first, up to ``max_tokens`` in all: a system prompt or template shared by many
requests is wanted up to where the requests diverge, a prompt seen once never is, and a
pattern that stops recurring fades out. A child never counts more than its parent (every
prompt through it passed the parent at the same moment), so finding them visits only
recurring nodes.

Memory: at most ``max_nodes`` trie nodes; past that, the least used leaves are dropped
(down to 90%, so pruning is amortized over many prompts).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import WarmPrefix


@attrs.frozen(kw_only=True)
class RecurringOptions:
    """Stack-file options of ``recurring``."""

    block_size: int = attrs.field(default=16, validator=attrs.validators.ge(1), metadata={
        "help": "token ids per block; must equal the executor's KV block size (block_size)"})
    min_uses: float = attrs.field(default=2.5, validator=attrs.validators.gt(1.0), metadata={
        "help": "decayed uses (each counts 1, halving every half_life_s) before a prefix recurs; "
                "2.5 = three uses a few minutes apart"})
    half_life_s: float = attrs.field(default=600.0, validator=attrs.validators.gt(0.0), metadata={
        "help": "a use counts half after this many seconds"})
    min_tokens: int = attrs.field(default=32, validator=attrs.validators.ge(1), metadata={
        "help": "shorter recurring prefixes are not worth keeping"})
    max_tokens: int = attrs.field(default=4096, validator=attrs.validators.ge(1), metadata={
        "help": "most tokens wanted in all (what the executor pins in its KV cache)"})
    max_nodes: int = attrs.field(default=20000, validator=attrs.validators.ge(16), metadata={
        "help": "most trie nodes (blocks) remembered; the least used are forgotten first"})


class _Node:
    __slots__ = ("key", "parent", "children", "uses", "stamp")

    def __init__(self, key: tuple[int, ...], parent: _Node | None) -> None:
        self.key, self.parent = key, parent
        self.children: dict[tuple[int, ...], _Node] = {}
        self.uses, self.stamp = 0.0, 0.0


class RecurringPrefixes:
    """Counts block-aligned prompt prefixes per salt and wants the recurring ones."""

    def __init__(self, options: RecurringOptions) -> None:
        self.options = options
        self._roots: dict[bytes, _Node] = {}
        self._nodes = 0
        self._decay = math.log(2) / options.half_life_s

    def _uses(self, node: _Node, now: float) -> float:
        return node.uses * math.exp(-self._decay * max(now - node.stamp, 0.0))

    def observe(self, token_ids: Sequence[int], *, salt: bytes, now: float) -> None:
        size = self.options.block_size
        node = self._roots.setdefault(salt, _Node((), None))
        for start in range(0, len(token_ids) - size + 1, size):
            key = tuple(token_ids[start:start + size])
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node(key, node)
                self._nodes += 1
            child.uses, child.stamp = self._uses(child, now) + 1.0, now
            node = child
        if self._nodes > self.options.max_nodes:
            self._prune(now)

    def _prune(self, now: float) -> None:
        """Drop the least used leaves (a parent whose last child goes becomes a candidate)."""
        target = int(self.options.max_nodes * 0.9)
        heap = [(self._uses(n, now), id(n), n) for n in self._all() if not n.children]
        heapq.heapify(heap)
        while self._nodes > target and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            self._nodes -= 1
            if not parent.children and parent.parent is not None:
                heapq.heappush(heap, (self._uses(parent, now), id(parent), parent))

    def _all(self) -> list[_Node]:
        out, stack = [], list(self._roots.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.parent is not None:
                out.append(node)
        return out

    def wanted(self, now: float) -> list[WarmPrefix]:
        options = self.options
        found: list[tuple[float, bytes, _Node, int]] = []
        for salt, root in self._roots.items():
            stack = [(root, 0)]
            while stack:
                node, depth = stack.pop()
                recurring = [c for c in node.children.values() if self._uses(c, now) >= options.min_uses]
                stack.extend((c, depth + 1) for c in recurring)
                if not recurring and depth * options.block_size >= options.min_tokens:
                    found.append((self._uses(node, now), salt, node, depth))
        found.sort(key=lambda f: (-f[0], -f[3]))
        out, budget = [], options.max_tokens
        for uses, salt, node, depth in found:
            if depth * options.block_size > budget:
                continue
            budget -= depth * options.block_size
            out.append(WarmPrefix(token_ids=_path(node), salt=salt, uses=uses))
        return out


def _path(node: _Node) -> tuple[int, ...]:
    blocks = []
    while node.parent is not None:
        blocks.append(node.key)
        node = node.parent
    return tuple(token for block in reversed(blocks) for token in block)


def build_recurring(options: RecurringOptions, context: BuildContext) -> RecurringPrefixes:
    """A pre-warm policy that wants the prompt prefixes recurring across requests."""
    return RecurringPrefixes(options)
