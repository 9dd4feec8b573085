"""Matrices held in ggml's block-quantized formats and multiplied by ggml's own CPU kernels.

`GgmlWeight` keeps a matrix ``[out, in]`` as the blocks llama.cpp reads from a GGUF file (Q4_1:
32 weights in 20 bytes; Q8_0: 32 in 34), and `matmul` computes ``x @ w.T`` with them through an
XLA FFI custom call (``plugins/lamina-jax/csrc/ggml_matmul.cc``), so a one-row decode reads the
compressed blocks rather than float32. XLA:CPU has no kernel that keeps 4-bit weights packed
inside a product. By default the call runs ggml-cpu's kernels, the ones llama.cpp itself runs on
the same file, which round the activations to 8 bits; with ``float32_activations`` it decodes the
blocks in registers against unrounded activations instead, giving the products of the float32
matrix the blocks hold (ggml has no such kernel).

The kernel is one of the native CPU kernels (`lamina_jax.model.cpu_kernels`); without them
`cpu_kernels.available` is False and the formats that need it are not offered.
"""

from __future__ import annotations

import ctypes
import functools

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from lamina_jax.model import cpu_kernels

TYPES = {"q4_1": 3, "q8_0": 8}
"""Block formats `quantize` accepts → ggml's ``enum ggml_type``."""
BLOCK = 32
"""Weights per block in every format of `TYPES`: a matrix's ``in`` must be a multiple of it."""
_TARGETS = {False: "lamina_ggml_matmul", True: "lamina_ggml_matmul_f32"}
"""Custom-call target by ``float32_activations``."""


@functools.partial(jax.tree_util.register_dataclass, data_fields=["blocks"], meta_fields=["kind", "columns"])
@attrs.frozen
class GgmlWeight:
    """A matrix ``[out, in]`` as ggml blocks: ``blocks [out, row bytes]`` uint8, of ``kind`` (a key of
    `TYPES`), ``columns`` = ``in``."""

    blocks: jax.Array
    kind: str
    columns: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.blocks.shape[0], self.columns


@functools.cache
def _library() -> ctypes.CDLL:
    """The kernels' library with the host-side helpers' signatures declared."""
    lib = cpu_kernels.require()
    lib.lamina_ggml_row_size.restype = ctypes.c_size_t
    lib.lamina_ggml_row_size.argtypes = [ctypes.c_int64, ctypes.c_int64]
    lib.lamina_ggml_quantize.restype = ctypes.c_size_t
    lib.lamina_ggml_quantize.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int64]
    lib.lamina_ggml_dequantize.restype = None
    lib.lamina_ggml_dequantize.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def quantizable(w: jax.Array | np.ndarray) -> bool:
    """Whether ``w`` is a matrix whose rows split into whole blocks."""
    return w.ndim == 2 and w.shape[1] % BLOCK == 0


def quantize(w: jax.Array | np.ndarray, kind: str) -> GgmlWeight:
    """``w [out, in]`` in ggml's ``kind`` blocks, by ggml's own quantizer (on the host). A matrix that
    came from blocks of the same kind gets those blocks back."""
    lib = _library()
    rows = np.ascontiguousarray(np.asarray(w, np.float32))
    if not quantizable(rows):
        raise ValueError(f"a {kind} matrix needs rows of a multiple of {BLOCK} weights, not {rows.shape}")
    blocks = np.empty((rows.shape[0], lib.lamina_ggml_row_size(TYPES[kind], rows.shape[1])), np.uint8)
    lib.lamina_ggml_quantize(TYPES[kind], rows.ctypes.data, blocks.ctypes.data, *rows.shape)
    return GgmlWeight(jnp.asarray(blocks), kind, rows.shape[1])


def dequantize(w: GgmlWeight) -> np.ndarray:
    """The float32 matrix ``w``'s blocks hold, decoded by ggml (on the host)."""
    lib = _library()
    blocks = np.ascontiguousarray(np.asarray(w.blocks))
    out = np.empty(w.shape, np.float32)
    lib.lamina_ggml_dequantize(TYPES[w.kind], blocks.ctypes.data, out.ctypes.data, out.size)
    return out


def lossless(w: jax.Array | np.ndarray, kind: str) -> bool:
    """Whether ``w`` is exactly a matrix of ``kind`` blocks (a GGUF's own, say), so that serving it
    from them changes no weight."""
    rows = np.asarray(w, np.float32)
    return quantizable(rows) and np.array_equal(dequantize(quantize(rows, kind)), rows)


def matmul(x: jax.Array, w: GgmlWeight, *, float32_activations: bool = False) -> jax.Array:
    """``x [..., in] @ w.T`` in float32. ggml's kernel quantizes the rows of ``x`` to its dot format
    (Q8_1 for Q4_1, Q8_0 for Q8_0) and multiplies them with the blocks; ``float32_activations``
    (Q4_1 and Q8_0 only) multiplies the unrounded rows with the decoded blocks."""
    cpu_kernels.require()
    rows = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    target = _TARGETS[float32_activations]
    out = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows.shape[0], w.shape[0]), jnp.float32))(
        rows, w.blocks, wtype=np.int64(TYPES[w.kind]))
    return out.reshape(*x.shape[:-1], w.shape[0])
