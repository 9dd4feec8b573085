"""Every plugin in the repository is under the import contracts that the tox env `lint` checks."""

from __future__ import annotations

import configparser
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_plugin_package_is_under_the_import_contracts() -> None:
    packages = [p for p in [*ROOT.glob("*/src/*"), *ROOT.glob("*/*/src/*")] if (p / "__init__.py").exists()]
    plugins = {p.name for p in packages} - {"lamina", "lamina_hookspecs"}
    assert {"lamina_jax", "lamina_hello"} <= plugins
    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = {c["type"]: c for c in linter["contracts"]}
    assert plugins | {"lamina", "lamina_hookspecs"} == set(linter["root_packages"])
    forbidden = {name: c for c in linter["contracts"] if c["type"] == "forbidden" for name in c["source_modules"]}
    assert set(forbidden) == plugins | {"lamina_hookspecs"}
    assert plugins == set(contracts["independence"]["modules"])
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    path = tox["testenv:lint"]["set_env"].split("PYTHONPATH =", 1)[1].strip().split(":")
    assert {Path(entry.replace("{toxinidir}", str(ROOT))) for entry in path} == {p.parent for p in packages}
