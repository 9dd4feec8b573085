"""The ``lamina`` command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lamina.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "stacks"


def test_plugins_lists_each_plugin_with_version_and_components(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "hello (lamina-hello 0.1.0)" in out and "router: shortest-queue" in out
    assert "executor: echo" in out


def test_plugins_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    hello = next(p for p in data["plugins"] if p["name"] == "hello")
    assert hello["registered"] == {"router": ["shortest-queue"]} and hello["error"] is None
    echo = next(c for c in data["components"] if c["name"] == "echo")
    assert {"name": "token_delay_s", "type": "float", "default": 0.0, "required": False,
            "help": "pause before each token, seconds"} in echo["options"]


def test_plugins_verbose_lists_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "-v"]) == 0
    assert "count_running: bool = True  count running requests too" in capsys.readouterr().out



def test_check_rejects_a_typo_naming_the_key_and_choices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stack = tmp_path / "typo.toml"
    stack.write_text('[router]\nuse = "round-robn"\n[executor]\nuse = "echo"\n')
    assert main(["check", str(stack)]) == 1
    err = capsys.readouterr().err
    assert "router.use: no router named 'round-robn'; did you mean 'round-robin'? installed: least-outstanding-tokens, p2c" in err


def test_route_explain_prints_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stack = tmp_path / "tree.toml"
    stack.write_text('[executor]\nuse = "echo"\n[route_tree.classes]\ntransactional = ["cancel"]\n'
                     '[route_tree.root]\nif = "intent has transactional"\n'
                     'then = { name = "txn", pool = "big", router = "round-robin" }\n'
                     'else = { name = "chat", pool = "small", router = "round-robin" }\n')
    assert main(["route", "explain", str(stack), "--prompt", "Cancel it", "--chat"]) == 0
    out = capsys.readouterr().out
    assert "intent = ('transactional',)" in out and "intent has transactional: yes" in out
    assert "leaf: txn -> pool 'big', router 'round-robin'" in out


def test_a_tool_without_the_tools_extra_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    for name in [name for name in sys.modules if name.startswith("lamina.tools")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rich", None)  # as if not installed: importing it raises ModuleNotFoundError
    assert main(["status", "http://127.0.0.1:9", "--once"]) == 2
    assert "needs rich, which comes with the tools extra: pip install 'lamina-core[tools]'" in capsys.readouterr().err


def test_the_command_line_and_the_servers_run_without_the_tools_extra() -> None:
    import subprocess
    import sys

    code = ("import sys\n"
            "for name in ('httpx', 'numpy', 'rich', 'tqdm'):\n"
            "    sys.modules[name] = None  # as if not installed\n"
            "from lamina.cli import main\n"
            "import lamina.pool, lamina.server.serve\n"
            f"assert main(['check', {str(EXAMPLES / 'echo.toml')!r}]) == 0\n"
            "assert main(['autoscale', 'replay', 'synthetic:step', '--policy', 'target']) == 2\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "lamina autoscale replay needs numpy, which comes with the tools extra" in done.stderr
