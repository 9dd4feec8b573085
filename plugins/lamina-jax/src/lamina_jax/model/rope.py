"""Rotary position embedding frequencies, plain or scaled as a model's configuration asks.

The formulas follow the published methods as Hugging Face's ``modeling_rope_utils`` and llama.cpp's
``ggml_rope_yarn`` compute them: ``linear`` (position interpolation: every frequency divided by the
factor), ``llama3`` (low frequencies divided by the factor, high ones kept, a smooth ramp between),
``yarn`` (NTK-by-parts interpolation plus an attention temperature) and per-dimension
``freq_factors`` (a GGUF's ``rope_freqs`` tensor, which is how llama.cpp's converter writes Llama 3's
scaling). Frequencies are computed on the host in float64 and are constants of the compiled model.
"""

from __future__ import annotations

import math
from typing import Literal

import attrs
import numpy as np

RopeKind = Literal["none", "linear", "llama3", "yarn"]
KINDS: tuple[str, ...] = ("none", "linear", "llama3", "yarn")


@attrs.frozen(kw_only=True)
class RopeScaling:
    """How a model scales its rotary frequencies; hashable (part of the static model configuration).

    :param factor: how much longer than ``original_context`` the scaled context is.
    :param original_context: the context length the model was pre-trained with (``llama3``, ``yarn``).
    :param freq_factors: a divisor per frequency, applied after any other scaling.
    :param attention_factor: YaRN's multiplier of cos and sin; ``None``: ``0.1 ln(factor) + 1``.
    """

    kind: RopeKind = "none"
    factor: float = 1.0
    original_context: int = 0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    freq_factors: tuple[float, ...] | None = None

    def __attrs_post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unsupported RoPE scaling {self.kind!r}: supported are {', '.join(KINDS)}")
        if self.kind in ("llama3", "yarn") and self.original_context <= 0:
            raise ValueError(f"{self.kind} RoPE scaling needs the original context length")


def _default(head_dim: int, base: float) -> np.ndarray:
    return 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def _llama3(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    low_wavelen, high_wavelen = s.original_context / s.low_freq_factor, s.original_context / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, (1 - smooth) * inv_freq / s.factor + smooth * inv_freq, scaled)


def _yarn(head_dim: int, base: float, s: RopeScaling) -> np.ndarray:
    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(s.original_context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(s.beta_fast)), 0)
    high = min(math.ceil(correction_dim(s.beta_slow)), head_dim - 1)
    ramp = np.clip((np.arange(head_dim // 2) - low) / max(high - low, 0.001), 0.0, 1.0)
    extrapolation = 1.0 - ramp  # 1: the dimension keeps its frequency; 0: it is interpolated
    inv_freq = _default(head_dim, base)
    return inv_freq / s.factor * (1 - extrapolation) + inv_freq * extrapolation


def inv_frequencies(head_dim: int, base: float, scaling: RopeScaling) -> np.ndarray:
    """The ``head_dim // 2`` rotation frequencies (radians per position), float32."""
    if scaling.kind == "yarn":
        inv_freq = _yarn(head_dim, base, scaling)
    else:
        inv_freq = _default(head_dim, base)
        if scaling.kind == "linear":
            inv_freq = inv_freq / scaling.factor
        elif scaling.kind == "llama3":
            inv_freq = _llama3(inv_freq, scaling)
    if scaling.freq_factors is not None:
        if len(scaling.freq_factors) != head_dim // 2:
            raise ValueError(f"{len(scaling.freq_factors)} RoPE frequency factors for {head_dim // 2} frequencies")
        inv_freq = inv_freq / np.asarray(scaling.freq_factors, np.float64)
    return inv_freq.astype(np.float32)


def attention_factor(scaling: RopeScaling) -> float:
    """The factor cos and sin are multiplied by: YaRN's temperature, else 1."""
    if scaling.kind != "yarn":
        return 1.0
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    return 1.0 if scaling.factor <= 1 else 0.1 * math.log(scaling.factor) + 1.0
