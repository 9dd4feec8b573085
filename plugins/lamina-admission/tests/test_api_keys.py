"""The api-keys authenticator: keys by reference, hashed, mapped to tenants."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from lamina.kernel.options import build_options
from lamina.testing.contracts import AuthenticatorContract
from lamina_hookspecs.errors import AuthenticationError, ConfigError
from lamina_hookspecs.protocols import Authenticator
from lamina_hookspecs.registration import BuildContext

from lamina_admission import ApiKeysOptions, build_api_keys

CONTEXT = BuildContext(stack_name="test")


def keys(**options: str) -> Authenticator:
    return build_api_keys(build_options(ApiKeysOptions, options, "admission[0]"), CONTEXT)


def test_env_keys_map_to_tenants(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_KEYS", "acme=sk-acme-1, acme=sk-acme-2,globex=sk-globex")
    auth = keys(keys_env="TEST_KEYS")
    assert isinstance(auth, Authenticator)
    one, two = auth.authenticate("sk-acme-1"), auth.authenticate("sk-acme-2")
    assert (one.tenant, two.tenant, auth.authenticate("sk-globex").tenant) == ("acme", "acme", "globex")
    assert one.key_id != two.key_id and one.key_id == hashlib.sha256(b"sk-acme-1").hexdigest()[:12]


def test_file_keys_with_comments_and_prehashed_entries(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"sk-hidden").hexdigest()
    path = tmp_path / "keys"
    path.write_text(f"# tenants\nacme = sk-acme   # the main key\n\nops=sha256:{digest}\n")
    auth = keys(keys_file=str(path))
    assert auth.authenticate("sk-acme").tenant == "acme"
    assert auth.authenticate("sk-hidden").tenant == "ops"
    with pytest.raises(AuthenticationError):
        auth.authenticate(f"sha256:{digest}")  # the digest itself is not a key


@pytest.mark.parametrize(("credential", "code"), [(None, "missing_api_key"), ("", "missing_api_key"),
                                                   ("sk-nope", "invalid_api_key"), ("sk-acm", "invalid_api_key")])
def test_missing_or_unknown_keys_are_401(monkeypatch: pytest.MonkeyPatch, credential: str | None, code: str) -> None:
    monkeypatch.setenv("TEST_KEYS", "acme=sk-acme")
    with pytest.raises(AuthenticationError) as info:
        keys(keys_env="TEST_KEYS").authenticate(credential)
    assert info.value.http_status == 401 and info.value.code == code
    assert "sk-acme" not in str(info.value)


def test_keys_are_stored_only_as_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_KEYS", "acme=sk-secret-value")
    auth = keys(keys_env="TEST_KEYS")
    assert "sk-secret-value" not in repr(vars(auth))


@pytest.mark.parametrize(("setup", "options", "message"), [
    ({}, {}, "keys_env: give keys_env or keys_file"),
    ({}, {"keys_env": "UNSET_KEYS_VAR"}, "keys_env: environment variable UNSET_KEYS_VAR is not set"),
    ({"TEST_KEYS": "acme"}, {"keys_env": "TEST_KEYS"}, "keys_env: $TEST_KEYS, line 1: expected tenant=key"),
    ({"TEST_KEYS": "a b=sk"}, {"keys_env": "TEST_KEYS"}, "tenant 'a b' must be"),
    ({"TEST_KEYS": "a=sk,b=sk"}, {"keys_env": "TEST_KEYS"}, "the same key is given twice"),
    ({"TEST_KEYS": " # none"}, {"keys_env": "TEST_KEYS"}, "no keys: every request would be refused"),
    ({}, {"keys_file": "/nonexistent/keys"}, "keys_file: cannot read /nonexistent/keys"),
])
def test_config_errors_name_the_option_and_never_a_key(monkeypatch: pytest.MonkeyPatch, setup: dict[str, str],
                                                      options: dict[str, str], message: str) -> None:
    monkeypatch.delenv("UNSET_KEYS_VAR", raising=False)
    for name, value in setup.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message.replace("$", r"\$")) as info:
        keys(**options)
    assert "=sk" not in str(info.value)


class TestApiKeysContract(AuthenticatorContract):
    registered_name = "api-keys"

    @pytest.fixture(autouse=True)
    def _keys(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("LAMINA_CONTRACT_KEYS", "acme=sk-contract")

    options = {"keys_env": "LAMINA_CONTRACT_KEYS"}
