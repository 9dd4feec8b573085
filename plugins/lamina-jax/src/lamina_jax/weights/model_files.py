"""Open a model from the files a user has: a GGUF file or a Hugging Face model directory.

`open_model` reads and checks everything but the weights first — the architecture, the
configuration, the tokenizer and the chat template — so a model that cannot be served is refused
in a moment, naming the file and the field, before gigabytes are read; `ModelFiles.load_params`
then reads the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import attrs

from lamina_jax.model.config import LlamaConfig
from lamina_jax.weight_formats import Place
from lamina_jax.model.llama import LlamaParams
from lamina_jax.tokenizer import Tokenizer
from lamina_jax.weights import gguf, hf

Progress = Callable[[int, int], None]


class ModelFileError(ValueError):
    """A model file that cannot be served; the message names the file and the reason."""


@attrs.frozen(kw_only=True, eq=False)
class ModelFiles:
    """A model whose configuration and tokenizer are read and checked; its weights are not yet."""

    path: Path
    format: Literal["gguf", "hf"]
    architecture: str
    config: LlamaConfig
    tokenizer: Tokenizer
    in_blocks: bool
    """Whether the file stores its decoder matrices in Q4_1 blocks and its head in Q8_0 (`gguf.in_blocks`)."""
    _read_params: Callable[[Progress | None, str, Place | None, int | None], LlamaParams]

    def load_params(self, progress: Progress | None = None, dtype: str = "float32",
                    place: Place | None = None, layers: int | None = None) -> LlamaParams:
        """Read every weight, held as ``dtype`` (``float32``, ``bfloat16``, ``int8`` or ``q4_1``: see
        `weight_formats.held`) and put where ``place`` says, tensor by tensor; ``progress(done, total)``
        after each. With ``layers``, only the first ``layers`` decoder layers (and the embedding,
        norm and head): a probe of the model."""
        try:
            return self._read_params(progress, dtype, place, layers)
        except (ValueError, KeyError, OSError) as error:
            raise ModelFileError(f"{self.path}: {error}") from error


def _open_gguf(path: Path) -> ModelFiles:
    reader, metadata, config = gguf.open_gguf(path)
    arch = metadata["general.architecture"]
    return ModelFiles(path=path, format="gguf", architecture=arch, config=config,
                      tokenizer=Tokenizer.from_gguf(metadata), in_blocks=gguf.in_blocks(reader),
                      read_params=lambda progress, dtype, place, layers: gguf.load_params(
                          reader, config, arch=arch, progress=progress, dtype=dtype, place=place, layers=layers))


def _open_hf(path: Path) -> ModelFiles:
    hf_config = hf.read_json(path / "config.json")
    config = hf.read_config(hf_config)
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError("no tokenizer.json (the tokenizer is read from it; a slow tokenizer's files "
                                "alone are not enough)")
    return ModelFiles(path=path, format="hf", architecture=hf.architecture(hf_config), config=config,
                      tokenizer=Tokenizer.from_hf(path), in_blocks=False,
                      read_params=lambda progress, dtype, place, layers: hf.load_params(
                          path, config, hf_config, progress=progress, dtype=dtype, place=place, layers=layers))


def open_model(path: str | Path) -> ModelFiles:
    """Open a GGUF file or a Hugging Face directory (one holding ``config.json``); `ModelFileError`
    names the file and the reason it cannot be served."""
    path = Path(path)
    try:
        if hf.is_model_dir(path):
            return _open_hf(path)
        if path.is_file():
            return _open_gguf(path)
    except (ValueError, KeyError, OSError, NotImplementedError) as error:
        reason = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        raise ModelFileError(f"{path}: {reason}") from error
    raise ModelFileError(f"{path}: neither a GGUF file nor a Hugging Face model directory (with config.json)")
