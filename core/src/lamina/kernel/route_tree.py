"""The routing tree: a decision tree over request features, written in the stack file, whose
leaves name a model pool and the router used inside that pool.

::

    [route_tree.classes]                  # keyword classes for the ``intent`` feature
    transactional = ["buy", "order", "cancel", "refund", "pay", "book"]

    [route_tree.root]
    if = "prompt_tokens > 1024"
    then = { pool = "long-context", router = "least-outstanding-tokens" }
    else.if = "intent has transactional"
    else.then = { name = "fast", pool = "small", router = { use = "p2c", seed = 7 } }
    else.else = { pool = "small", router = "round-robin" }

A node is a leaf (``pool``: the model id of the backends it uses, ``router``: a router name or
``{ use = ..., options }``, optional ``name``) or a branch (``if`` a condition, ``then`` and
``else`` nodes). A condition is ``<feature> <op> <value>`` with op one of ``== != > >= < <=``,
``in [a, b]`` or ``has`` (for the ``intents`` set). Features are computed once per request:

- ``prompt_tokens``: exact for token ids, else ~4 UTF-8 bytes per token (as token limits estimate);
- ``tenant``, ``model``, ``user``: as admitted;
- ``intent``: the ``classes`` whose keywords occur in the prompt (whole words, any case);
- ``entity_density``: share of words that look like entities (capitalised mid-sentence, digits);
- ``freshness``: how many temporal-freshness terms ("today", "latest", a recent year...) occur.

The chosen leaf sets the request's model to its pool, so clients may ask for any model name
the tree maps (``"auto"``). The path, leaf and features are logged with the request and the
leaf is counted in ``lamina_route_tree_requests_total{leaf}``; ``lamina route explain`` prints
the path a prompt takes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.types import Request

FEATURES = ("prompt_tokens", "tenant", "model", "user", "intent", "entity_density", "freshness")
FRESHNESS_TERMS = ("today", "tonight", "yesterday", "tomorrow", "now", "currently", "current", "latest", "recent",
                   "recently", "this week", "this month", "this year", "breaking", "news", "update", "updated")
_YEAR = re.compile(r"\b20[2-9]\d\b")
_WORD = re.compile(r"[A-Za-z0-9][\w'-]*")
_CONDITION = re.compile(r"^\s*(\w+)\s*(==|!=|>=|<=|>|<|\bin\b|\bhas\b)\s*(.+?)\s*$")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, "in": lambda a, b: a in b, "has": lambda a, b: b in a,
}


@attrs.frozen(kw_only=True)
class Features:
    """What the tree decides on; computed once per request."""

    prompt_tokens: int
    tenant: str
    model: str
    user: str
    intent: tuple[str, ...]
    entity_density: float
    freshness: int


def prompt_text(request: Request) -> str:
    if request.messages is not None:
        return "\n".join(m.content for m in request.messages)
    return request.prompt or ""


def features(request: Request, classes: Mapping[str, frozenset[str]]) -> Features:
    """The request's features; ``classes`` maps an intent class to its lower-case keywords."""
    text = prompt_text(request)
    tokens = request.estimated_prompt_tokens()
    words = _WORD.findall(text)
    lowered = {w.lower() for w in words}
    entities = sum(1 for i, w in enumerate(words)
                   if any(c.isdigit() for c in w) or (i and w[0].isupper() and not words[i - 1].endswith(".")))
    low_text = text.lower()
    fresh = sum(1 for term in FRESHNESS_TERMS
                if (" " in term and term in low_text) or term in lowered) + len(_YEAR.findall(text))
    return Features(prompt_tokens=tokens, tenant=request.tenant, model=request.model, user=request.user or "",
                    intent=tuple(name for name, keywords in classes.items() if lowered & keywords),
                    entity_density=entities / len(words) if words else 0.0, freshness=fresh)


@attrs.frozen
class Condition:
    feature: str
    op: str
    value: Any
    text: str

    def holds(self, values: Features) -> bool:
        return _OPS[self.op](getattr(values, self.feature), self.value)


@attrs.frozen
class Leaf:
    name: str
    pool: str
    router: Any  # a built Router (or its spec, before the stack is built)


@attrs.frozen
class Branch:
    condition: Condition
    then: Branch | Leaf
    otherwise: Branch | Leaf


@attrs.frozen
class RouteTree:
    """A parsed tree and the intent classes its ``intent`` feature uses."""

    root: Branch | Leaf
    classes: dict[str, frozenset[str]]

    def decide(self, request: Request) -> tuple[Features, Leaf, list[str]]:
        """The request's features, its leaf, and the path to it (one line per decision)."""
        values = features(request, self.classes)
        node, path = self.root, []
        while isinstance(node, Branch):
            taken = node.condition.holds(values)
            path.append(f"{node.condition.text}: {'yes' if taken else 'no'}")
            node = node.then if taken else node.otherwise
        return values, node, path

    def leaves(self) -> list[Leaf]:
        found, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if isinstance(node, Leaf):
                found.append(node)
            else:
                stack += [node.otherwise, node.then]
        return found

    def map_routers(self, build: Callable[[Leaf], Any]) -> RouteTree:
        """The same tree with each leaf's router replaced by ``build(leaf)``."""
        def walk(node: Branch | Leaf) -> Branch | Leaf:
            if isinstance(node, Leaf):
                return attrs.evolve(node, router=build(node))
            return Branch(node.condition, walk(node.then), walk(node.otherwise))

        return RouteTree(walk(self.root), self.classes)


def parse_tree(table: Mapping[str, Any], path: str, router_spec: Callable[[Any, str], Any]) -> RouteTree:
    """A ``[route_tree]`` table; ``router_spec(value, path)`` validates a leaf's router."""
    classes_table = table.get("classes", {})
    if not isinstance(classes_table, Mapping) or not all(
            isinstance(v, list) and all(isinstance(w, str) for w in v) for v in classes_table.values()):
        raise ConfigError(f"{path}.classes", "must map each class name to a list of keywords")
    for key in table:
        if key not in ("classes", "root"):
            raise ConfigError(f"{path}.{key}", "unknown key; keys: classes, root")
    if "root" not in table:
        raise ConfigError(f"{path}.root", "missing: the tree's first node")
    classes = {name: frozenset(w.lower() for w in words) for name, words in classes_table.items()}
    tree = RouteTree(_node(table["root"], f"{path}.root", classes, router_spec), classes)
    names = [leaf.name for leaf in tree.leaves()]
    if len(set(names)) < len(names):
        raise ConfigError(f"{path}.root", f"leaf names must be unique (give each a name); got {', '.join(names)}")
    return tree


def _node(value: Any, path: str, classes: Mapping[str, frozenset[str]],
          router_spec: Callable[[Any, str], Any]) -> Branch | Leaf:
    if not isinstance(value, Mapping):
        raise ConfigError(path, "must be a table: a leaf (pool, router) or a branch (if, then, else)")
    if "if" in value:
        extra = set(value) - {"if", "then", "else"}
        if extra or "then" not in value or "else" not in value:
            raise ConfigError(path, "a branch has exactly: if, then, else")
        return Branch(_condition(value["if"], f"{path}.if", classes),
                      _node(value["then"], f"{path}.then", classes, router_spec),
                      _node(value["else"], f"{path}.else", classes, router_spec))
    extra = set(value) - {"name", "pool", "router"}
    if extra or "pool" not in value or "router" not in value:
        raise ConfigError(path, f"a leaf has pool, router and optionally name; got {', '.join(sorted(value))}")
    router = router_spec(value["router"], f"{path}.router")
    name = value.get("name") or f"{value['pool']}/{router.name}"
    return Leaf(name=str(name), pool=str(value["pool"]), router=router)


def _condition(text: Any, path: str, classes: Mapping[str, frozenset[str]]) -> Condition:
    match = _CONDITION.match(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(path, f"must read '<feature> <op> <value>' (ops: {', '.join(_OPS)}); got {text!r}")
    feature, op, raw = match.groups()
    if feature not in FEATURES:
        raise ConfigError(path, f"unknown feature {feature!r}; features: {', '.join(FEATURES)}")
    value = _value(raw)
    if (op == "has") != (feature == "intent"):
        raise ConfigError(path, "'has' tests the intent set, and intent is tested only with 'has'")
    if feature == "intent" and value not in classes:
        raise ConfigError(path, f"no intent class {value!r} in classes; classes: {', '.join(classes) or 'none'}")
    if op == "in" and not isinstance(value, tuple):
        raise ConfigError(path, "'in' takes a list: tenant in [acme, globex]")
    numeric = feature in ("prompt_tokens", "entity_density", "freshness")
    if numeric != isinstance(value, (int, float)) and op != "in":
        raise ConfigError(path, f"{feature} compares with a {'number' if numeric else 'name'}; got {raw!r}")
    return Condition(feature, op, value, text.strip())


def _value(raw: str) -> Any:
    if raw.startswith("[") and raw.endswith("]"):
        return tuple(_value(part.strip()) for part in raw[1:-1].split(",") if part.strip())
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw.strip("'\"")
