"""STC, Lamina's binary streaming token codec. Registered through the ``lamina`` entry point ``stc``."""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_stc.codec import build_stc
from lamina_stc.compression import StcZstdOptions, build_stc_zstd


@hookimpl
def lamina_register_codecs(register: Register) -> None:
    register("stc", build_stc)
    register("stc-zstd", build_stc_zstd, options=StcZstdOptions)
