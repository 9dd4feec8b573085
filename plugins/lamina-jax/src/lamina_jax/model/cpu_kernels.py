"""The native library of CPU kernels (``plugins/lamina-jax/csrc``), loaded once and its XLA FFI
custom calls registered: ggml's block-quantized matmul (`lamina_jax.model.ggml`) and paged
attention (`lamina_jax.model.attention_kernel`).

It is built once per machine by ``scripts/kernels/build_cpu_kernels.sh`` (found by
`lamina_jax.native.cpu_kernels_library`); without it `available` is False, the weight formats that
need it are not offered and attention keeps its JAX form.
"""

from __future__ import annotations

import ctypes
import functools

import jax

from lamina_jax.native import CPU_KERNELS_BUILD_HINT, cpu_kernels_library

TARGETS = {
    "lamina_ggml_matmul": "LaminaGgmlMatmul",
    "lamina_ggml_matmul_f32": "LaminaGgmlMatmulF32",
    "lamina_paged_attention": "LaminaPagedAttention",
}
"""Custom-call target → the library's handler symbol."""


@functools.cache
def library() -> ctypes.CDLL | None:
    """The library, loaded and its handlers registered with XLA; None when it is not built."""
    path = cpu_kernels_library()
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    for target, symbol in TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    return lib


def available() -> bool:
    """Whether the kernels are built for this machine (and the backend is the CPU they run on)."""
    return jax.default_backend() == "cpu" and library() is not None


def require() -> ctypes.CDLL:
    """The library, or a RuntimeError that says how to build it."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"the CPU kernels are not built for this machine: {CPU_KERNELS_BUILD_HINT}")
    return lib
