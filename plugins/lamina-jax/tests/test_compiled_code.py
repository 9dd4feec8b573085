"""`release_compiled_code`: JAX's compiled executables are dropped only near the map limit, and
dropping them gives their memory maps back."""

import jax
import jax.numpy as jnp
import pytest

from lamina_jax import testing


def _maps() -> int:
    counted = testing._memory_maps()
    if counted is None:
        pytest.skip("no /proc/self/maps here")
    return counted[0]


def test_compiled_code_is_released_near_the_map_limit_and_its_maps_come_back(monkeypatch: pytest.MonkeyPatch) -> None:
    functions = [jax.jit(lambda x, i=i: jnp.tanh(x @ x.T + i).sum(axis=0) * jnp.arange(64.0)) for i in range(20)]
    for f in functions:
        f(jnp.ones((64, 64))).block_until_ready()
    assert all(f._cache_size() == 1 for f in functions)
    monkeypatch.setattr(testing, "MAP_SHARE", 1.0)
    assert not testing.release_compiled_code()
    assert all(f._cache_size() == 1 for f in functions)
    before = _maps()
    monkeypatch.setattr(testing, "MAP_SHARE", 0.0)
    assert testing.release_compiled_code()
    assert all(f._cache_size() == 0 for f in functions)
    assert _maps() < before
