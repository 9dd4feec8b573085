"""The routing tree: conditions, features, decisions and the errors of a bad tree."""

from __future__ import annotations

from typing import Any

import pytest
from lamina.kernel.route_tree import features
from lamina.kernel.stack_config import StackConfig
from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.types import ChatMessage, Request

TREE: dict[str, Any] = {
    "classes": {"transactional": ["buy", "order", "Cancel"]},
    "root": {
        "if": "prompt_tokens > 100",
        "then": {"name": "long", "pool": "big", "router": "round-robin"},
        "else": {
            "if": "intent has transactional",
            "then": {"name": "txn", "pool": "big", "router": {"use": "round-robin"}},
            "else": {"if": "tenant in [acme, globex]",
                     "then": {"name": "vip", "pool": "small", "router": "round-robin"},
                     "else": {"pool": "small", "router": "round-robin"}},
        },
    },
}


def tree(make_plugins: Any, root: Any = None) -> Any:
    table = dict(TREE) if root is None else {**TREE, "root": root}
    return StackConfig.from_dict({"executor": {"use": "echo"}, "route_tree": table},
                                 make_plugins(entry_points=True).registry).route_tree


@pytest.mark.parametrize(("prompt", "tenant", "leaf", "path"), [
    ("word " * 200, "t", "long", ["prompt_tokens > 100: yes"]),
    ("please CANCEL my order", "t", "txn", ["prompt_tokens > 100: no", "intent has transactional: yes"]),
    ("hello there", "acme", "vip", ["prompt_tokens > 100: no", "intent has transactional: no",
                                    "tenant in [acme, globex]: yes"]),
    ("hello there", "other", "small/round-robin", ["prompt_tokens > 100: no", "intent has transactional: no",
                                                   "tenant in [acme, globex]: no"]),
])
def test_decisions_and_paths(make_plugins: Any, prompt: str, tenant: str, leaf: str, path: list[str]) -> None:
    values, chosen, taken = tree(make_plugins).decide(Request(id="r", model="auto", prompt=prompt, tenant=tenant))
    assert (chosen.name, taken) == (leaf, path)
    assert chosen.pool == ("big" if leaf in ("long", "txn") else "small")


def test_features() -> None:
    classes = {"transactional": frozenset({"refund"}), "greeting": frozenset({"hello"})}
    chat = Request(id="r", model="m", messages=(ChatMessage(role="system", content="Be brief."),
                                                ChatMessage(role="user", content="I want a refund for order 42 "
                                                                                 "from Acme, latest news today")))
    values = features(chat, classes)
    assert values.intent == ("transactional",)
    assert values.freshness == 3  # latest, news, today
    assert values.prompt_tokens > 2 * 4  # two messages' overhead plus the text
    assert 0 < values.entity_density < 1
    ids = features(Request(id="r", model="m", prompt_token_ids=(1, 2, 3)), classes)
    assert ids.prompt_tokens == 3 and ids.intent == () and ids.entity_density == 0.0


@pytest.mark.parametrize(("root", "path", "problem"), [
    ({"if": "tokens > 5", "then": {"pool": "a", "router": "round-robin"}, "else": {"pool": "b", "router": "round-robin"}},
     "route_tree.root.if", "unknown feature 'tokens'"),
    ({"if": "prompt_tokens > many", "then": {"pool": "a", "router": "round-robin"},
      "else": {"pool": "b", "router": "round-robin"}}, "route_tree.root.if", "compares with a number"),
    ({"if": "intent has shopping", "then": {"pool": "a", "router": "round-robin"},
      "else": {"pool": "b", "router": "round-robin"}}, "route_tree.root.if", "no intent class 'shopping'"),
    ({"if": "prompt_tokens > 5", "then": {"pool": "a", "router": "round-robn"},
      "else": {"pool": "b", "router": "round-robin"}}, "route_tree.root.then.router.use", "did you mean"),
    ({"if": "prompt_tokens > 5", "then": {"pool": "a"}, "else": {"pool": "b", "router": "round-robin"}},
     "route_tree.root.then", "a leaf has pool, router"),
    ({"if": "prompt_tokens > 5", "then": {"pool": "a", "router": "round-robin"}}, "route_tree.root", "if, then, else"),
    ({"if": "prompt_tokens > 5", "then": {"pool": "a", "router": "round-robin"},
      "else": {"pool": "a", "router": "round-robin"}}, "route_tree.root", "unique"),
])
def test_bad_trees_name_the_node(make_plugins: Any, root: Any, path: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        tree(make_plugins, root)
    assert info.value.path == path and problem in str(info.value), (info.value.path, str(info.value))
