"""The conformance kit has a contract for every kind of component a plugin can register."""

from __future__ import annotations

import inspect

from lamina.testing import contracts
from lamina_hookspecs.layers import LAYERS


def test_every_component_kind_has_a_contract() -> None:
    covered = {cls.layer for _, cls in inspect.getmembers(contracts, inspect.isclass)
               if issubclass(cls, contracts.ComponentContract) and cls is not contracts.ComponentContract}
    missing = [layer.key for layer in LAYERS if layer not in covered]
    assert not missing, f"no contract in lamina.testing.contracts for {missing}"
