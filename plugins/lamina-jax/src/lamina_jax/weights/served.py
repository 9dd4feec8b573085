"""The weights a model is served with: read in the format ``weights_dtype`` names, or, for ``auto``,
in the formats measured fastest on this machine (`lamina_jax.weight_formats`), each read straight
into the dtype it is held in, tensor by tensor."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import attrs
import jax

from lamina_jax import weight_formats
from lamina_jax.model import cpu_kernels
from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.llama import LlamaParams
from lamina_jax.weights.model_files import ModelFiles

Shape = tuple[str, int]
Read = Callable[[str, weight_formats.Place | None, int | None], LlamaParams]
"""``(dtype, place, layers) → params``: `ModelFiles.load_params` (with a progress bar, say)."""


@attrs.frozen(kw_only=True, eq=False)
class ServedWeights:
    """The default weights and configuration, and those of the shapes served in another format."""

    params: LlamaParams
    config: LlamaConfig
    shape_weights: dict[Shape, tuple[LlamaParams, LlamaConfig]]
    timings: dict[int, dict[str, float]] | None = None
    """``auto``'s estimates (`weight_formats.measure`), seconds by row count and format."""

    @property
    def chosen(self) -> dict[int, str] | None:
        """``auto``'s pick at each row count."""
        return None if self.timings is None else weight_formats.fastest(self.timings)


def load_weights(files: ModelFiles, weights_dtype: str, shapes: list[Shape], *,
                 place: weight_formats.Place | None = None, tensor_parallel: int = 1,
                 read: Read | None = None) -> ServedWeights:
    """Read the weights ``weights_dtype`` asks for. ``auto`` times its formats on a float32 probe
    of the model (its first layers, `weight_formats.probe_layers`, and its head), frees it, and
    reads the model once per weight dtype the fastest formats hold, so no float32 copy of the whole
    model is made unless float32 is picked. ``place`` lays each tensor out as it is read (the probe
    stays on the default device)."""
    read = read or (lambda dtype, where, layers: files.load_params(None, dtype, where, layers))
    config = files.config
    if weights_dtype != "auto":
        dtype = weight_formats.FORMATS[weights_dtype][0]
        if dtype == "q4_1" and not cpu_kernels.available():
            raise ValueError(f"weights_dtype = {weights_dtype!r} needs the ggml kernel on the CPU backend; JAX runs "
                             f"on {jax.default_backend()} here")
        return ServedWeights(params=read(dtype, place, None), config=weight_formats.configure(config, weights_dtype),
                             shape_weights={})
    probe = read("float32", None, weight_formats.probe_layers(config))
    formats = [fmt for fmt in weight_formats.auto(probe, files.in_blocks)
               if tensor_parallel == 1 or weight_formats.FORMATS[fmt][0] != "q4_1"]
    timings = weight_formats.measure(probe, sorted({rows for _, rows in shapes}), formats, config.n_layers)
    del probe
    choice = weight_formats.fastest(timings)
    default = Counter(choice.values()).most_common(1)[0][0]
    held = {dtype: read(dtype, place, None) for dtype in sorted({weight_formats.FORMATS[f][0] for f in choice.values()})}
    weights = {fmt: (held[weight_formats.FORMATS[fmt][0]], weight_formats.configure(config, fmt))
               for fmt in set(choice.values())}
    return ServedWeights(params=weights[default][0], config=weights[default][1], timings=timings,
                         shape_weights={shape: weights[choice[shape[1]]] for shape in shapes
                                        if choice[shape[1]] != default})
