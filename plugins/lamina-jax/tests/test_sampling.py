"""Batched per-row sampling against numpy references: greedy, temperature, top-k, top-p, min-p,
penalties, logit bias, logprobs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lamina_jax.sampling import SampleResult, SamplingBatch, request_key, sample, unadjusted

VOCAB = 64


def run(
    logits: np.ndarray,
    *,
    temperature: float | list[float] = 1.0,
    top_k: int | list[int] = 0,
    top_p: float | list[float] = 1.0,
    seeds: list[int] | None = None,
    steps: np.ndarray | None = None,
    num_top: int = 0,
    max_top_k: int | None = None,
    all_greedy: bool = False,
    min_p: float = 0.0,
    **adjust: object,
) -> SampleResult:
    """`sample` on ``logits [B, V]``; scalars apply to every row, rows default to seed = row index;
    ``adjust`` replaces fields of `unadjusted` (and turns adjusting on)."""
    rows = logits.shape[0]
    keys = np.stack([request_key(seed) for seed in (seeds if seeds is not None else range(rows))])
    fields = unadjusted(rows, 8, logits.shape[1]) | adjust | ({"adjust": np.bool_(True)} if adjust else {})
    batch = SamplingBatch(
        temperature=jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (rows,)),
        top_k=jnp.broadcast_to(jnp.asarray(top_k, jnp.int32), (rows,)),
        top_p=jnp.broadcast_to(jnp.asarray(top_p, jnp.float32), (rows,)),
        keys=jnp.asarray(keys),
        steps=jnp.asarray(np.zeros(rows) if steps is None else steps, jnp.int32),
        min_p=jnp.full((rows,), min_p, jnp.float32),
        **fields,
    )
    return sample(jnp.asarray(logits), batch, num_top=num_top, max_top_k=max_top_k, all_greedy=all_greedy)


def random_logits(rows: int, vocab: int = VOCAB, *, seed: int = 0, scale: float = 2.0) -> np.ndarray:
    return (scale * np.random.default_rng(seed).standard_normal((rows, vocab))).astype(np.float32)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def nucleus(probs: np.ndarray, top_p: float) -> set[int]:
    """Smallest set of most likely tokens whose mass reaches ``top_p``."""
    order = np.argsort(-probs, kind="stable")
    mass_before = np.cumsum(probs[order]) - probs[order]
    return set(order[mass_before < top_p].tolist())


def test_request_key_is_jax_prng_key() -> None:
    for seed in (0, 5, 2**31 + 7, 2**32 - 1):
        np.testing.assert_array_equal(request_key(seed), np.asarray(jax.random.PRNGKey(seed)))
    assert request_key(None).dtype == np.uint32 and request_key(None).shape == (2,)
    assert not np.array_equal(request_key(None), request_key(None))


def test_greedy_logprobs_and_top() -> None:
    logits = random_logits(8)
    logits[3, [7, 20]] = logits[3].max() + 1.0  # a tie: the lowest id wins, as with argmax
    result = run(logits, temperature=0.0, num_top=5)
    np.testing.assert_array_equal(result.tokens, np.argmax(logits, axis=-1))
    assert result.tokens[3] == 7
    expected = log_softmax(logits)
    np.testing.assert_allclose(result.logprobs, expected[np.arange(8), np.argmax(logits, axis=-1)], atol=1e-5)
    top_ids = np.argsort(-logits, axis=-1, kind="stable")[:, :5]
    np.testing.assert_array_equal(result.top_ids, top_ids)
    np.testing.assert_allclose(result.top_logprobs, np.take_along_axis(expected, top_ids, axis=-1), atol=1e-5)
    assert result.tokens.dtype == result.top_ids.dtype == jnp.int32

    empty = run(logits, temperature=0.0, num_top=0)
    assert empty.top_ids.shape == empty.top_logprobs.shape == (8, 0)

    fast = run(logits, temperature=0.0, num_top=5, all_greedy=True)  # the variant without the random path
    for name in ("tokens", "logprobs", "top_ids", "top_logprobs"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(result, name))


def test_mixed_batch_rows_are_independent() -> None:
    """Greedy rows give the argmax whatever their neighbours; a seeded row's token ignores the batch."""
    logits = random_logits(8, seed=1)
    temperature = [0.0, 1.5, 0.0, 0.8, 0.0, 1.0, 0.0, 2.0]
    top_k, top_p = [0, 0, 5, 10, 0, 0, 0, 3], [1.0, 1.0, 1.0, 0.9, 0.3, 0.5, 1.0, 1.0]
    result = run(logits, temperature=temperature, top_k=top_k, top_p=top_p, seeds=list(range(8)))
    greedy = np.array(temperature) == 0
    np.testing.assert_array_equal(result.tokens[greedy], np.argmax(logits, axis=-1)[greedy])
    # Sampled rows report the logprob of the unmodified distribution.
    np.testing.assert_allclose(result.logprobs, log_softmax(logits)[np.arange(8), result.tokens], atol=1e-5)

    # The same rows in another order, next to greedy rows instead: each row keeps its token.
    perm = np.array([5, 3, 7, 1, 0, 2, 4, 6])
    shuffled = run(
        logits[perm],
        temperature=list(np.array(temperature)[perm]),
        top_k=list(np.array(top_k)[perm]),
        top_p=list(np.array(top_p)[perm]),
        seeds=list(perm),
    )
    np.testing.assert_array_equal(shuffled.tokens, result.tokens[perm])
    alone = run(logits, temperature=[1.5 if i == 1 else 0.0 for i in range(8)], seeds=list(range(8)))
    assert alone.tokens[1] == result.tokens[1]


def test_same_key_same_token_and_steps_differ() -> None:
    logits = np.repeat(random_logits(1, scale=0.5), 8, axis=0)
    first = run(logits, temperature=1.0, seeds=[42] * 8, steps=np.arange(8))
    again = run(logits, temperature=1.0, seeds=[42] * 8, steps=np.arange(8))
    np.testing.assert_array_equal(first.tokens, again.tokens)
    assert len(set(first.tokens.tolist())) > 1  # steps fold into the key: near-uniform draws vary


def test_filters_pick_greedy_at_their_limits() -> None:
    logits = random_logits(8, seed=2)
    argmax = np.argmax(logits, axis=-1)
    for step in range(3):
        steps = np.full(8, step)
        np.testing.assert_array_equal(run(logits, temperature=2.0, top_k=1, steps=steps).tokens, argmax)
        for top_p in (0.01, 0.0):  # the most likely token always stays
            np.testing.assert_array_equal(run(logits, temperature=2.0, top_p=top_p, steps=steps).tokens, argmax)


def test_distributions_match_numpy() -> None:
    """Thousands of draws over 8 tokens: plain temperature, top-k 3 and top-p 0.5 against their references."""
    draws, temperature = 4000, 0.7
    row = np.array([1.0, 0.2, -0.5, 0.9, 0.0, -1.0, 0.5, 0.3], np.float32)
    scaled = np.exp(row / temperature - (row / temperature).max())
    probs = scaled / scaled.sum()
    top3 = np.argsort(-row)[:3]
    kept = sorted(nucleus(probs, 0.5))
    references = []
    for support in (np.arange(8), top3, np.array(kept)):
        reference = np.zeros(8)
        reference[support] = probs[support] / probs[support].sum()
        references.append(reference)
    assert 1 < len(kept) < 8

    logits = np.tile(row, (3 * draws, 1))
    top_k = np.repeat([0, 3, 0], draws)
    top_p = np.repeat([1.0, 1.0, 0.5], draws)
    result = run(
        logits,
        temperature=temperature,
        top_k=list(top_k),
        top_p=list(top_p),
        seeds=[7] * (3 * draws),
        steps=np.arange(3 * draws),
    )
    for i, reference in enumerate(references):
        counts = np.bincount(np.asarray(result.tokens[i * draws : (i + 1) * draws]), minlength=8)
        assert np.all(counts[reference == 0] == 0)  # never outside the top-k / nucleus
        assert 0.5 * np.abs(counts / draws - reference).sum() < 0.05


@pytest.mark.parametrize("top_p", [1.0, 0.5])
def test_filters_never_leave_their_support(top_p: float) -> None:
    logits = random_logits(8, seed=3, scale=1.0)
    probs = np.exp(log_softmax(logits))
    for step in range(10):
        result = run(logits, temperature=1.0, top_k=5, top_p=top_p, steps=np.full(8, step))
        for row, token in enumerate(np.asarray(result.tokens)):
            top5 = set(np.argsort(-logits[row], kind="stable")[:5].tolist())
            assert token in top5
            top5_probs = np.where(np.isin(np.arange(VOCAB), list(top5)), probs[row], 0.0)
            assert token in nucleus(top5_probs / top5_probs.sum(), top_p)


def test_max_top_k_gives_the_same_tokens() -> None:
    """The top-K shortcut, and its fallback when a row does not fit, draw what the full sort draws."""
    logits = random_logits(8, vocab=512, seed=4, scale=3.0)
    temperature = [0.0, 1.0, 0.7, 1.3, 1.0, 1.0, 0.5, 1.0]
    top_p = [1.0, 0.75, 1.0, 0.95, 0.5, 1.0, 1.0, 0.8]
    fitting = [0, 0, 8, 32, 0, 20, 1, 0]  # every nucleus lies within the 32 most likely tokens
    for top_k in (fitting, fitting[:-1] + [200]):
        for step in range(4):
            common = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "steps": np.full(8, step)}
            full = run(logits, **common)
            np.testing.assert_array_equal(run(logits, **common, max_top_k=32).tokens, full.tokens)


def test_one_compile_serves_every_mix() -> None:
    logits = random_logits(3, vocab=40, seed=5)
    before = sample._cache_size()
    for temperature, top_k, top_p in (
        (0.0, 0, 1.0),
        (1.0, 0, 1.0),
        ([0.0, 1.0, 0.5], [0, 4, 0], [1.0, 1.0, 0.7]),
        (0.9, 10, 0.9),
    ):
        run(logits, temperature=temperature, top_k=top_k, top_p=top_p, num_top=2)
    assert sample._cache_size() == before + 1


def test_penalties_follow_vllms_formulas() -> None:
    logits = random_logits(2, seed=11)
    history = np.full((2, 8), -1, np.int32)
    history[0, :5] = [3, 4, 5, 5, 9]  # prompt 3, 4; output 5, 5, 9
    history[1, :2] = [7, 7]  # prompt only
    output_from = np.array([2, 2], np.int32)
    repetition, presence, frequency = np.array([1.5, 2.0], np.float32), np.array([0.5, 0.5], np.float32), \
        np.array([0.25, 0.25], np.float32)
    result = run(logits, temperature=0.0, history=history, output_from=output_from, repetition=repetition,
                 presence=presence, frequency=frequency)
    expected = logits.astype(np.float64).copy()
    for row in range(2):
        seen = set(history[row][history[row] >= 0].tolist())
        for token in seen:
            value = expected[row, token]
            expected[row, token] = value / repetition[row] if value > 0 else value * repetition[row]
        outputs = history[row, output_from[row]:]
        for token in set(outputs[outputs >= 0].tolist()):
            count = int((outputs == token).sum())
            expected[row, token] -= frequency[row] * count + presence[row]
    assert result.tokens.tolist() == expected.argmax(axis=-1).tolist()
    # logprobs stay the model's own
    np.testing.assert_allclose(np.asarray(result.logprobs),
                               log_softmax(logits)[np.arange(2), np.asarray(result.tokens)], atol=1e-5)


def bitmask(rows: list[list[int] | None], vocab: int) -> np.ndarray:
    """The `SamplingBatch.allowed` words letting each row choose only its listed tokens (``None``: any)."""
    bits = np.ones((len(rows), -(-vocab // 32) * 32), np.uint8)
    for i, tokens in enumerate(rows):
        if tokens is not None:
            bits[i] = 0
            bits[i, tokens] = 1
    return np.packbits(bits, axis=1, bitorder="little").view(np.int32)


def test_a_token_bitmask_limits_greedy_and_random_rows_to_its_tokens() -> None:
    vocab = 1000  # not a multiple of 32: the last word's spare bits stay unused
    logits = random_logits(3, vocab, seed=21)
    allowed = [[5, 40, 999], [7, 8, 9, 300], None]
    masks = bitmask(allowed, vocab)
    for temperature in (0.0, 1.0):
        result = run(logits, temperature=temperature, allowed=masks, guided=np.bool_(True))
        tokens = np.asarray(result.tokens)
        assert tokens[0] in allowed[0] and tokens[1] in allowed[1]
        if temperature == 0:
            assert tokens[0] == max(allowed[0], key=lambda t: logits[0, t])
        # the unguided row chooses as it would in a batch without a mask
        assert tokens[2] == np.asarray(run(logits, temperature=temperature).tokens)[2]
        # logprobs stay the model's
        np.testing.assert_allclose(np.asarray(result.logprobs), log_softmax(logits)[np.arange(3), tokens], atol=1e-5)
    draws = {int(np.asarray(run(logits[1:2], temperature=2.0, seeds=[seed], allowed=masks[1:2],
                                 guided=np.bool_(True)).tokens)[0]) for seed in range(40)}
    assert draws <= set(allowed[1]) and len(draws) > 1


def test_a_logit_bias_forces_and_forbids_tokens() -> None:
    logits = random_logits(3, seed=12)
    bias_ids = np.full((3, unadjusted(3, 1, VOCAB)["bias_ids"].shape[1]), -1, np.int32)
    bias_values = np.zeros(bias_ids.shape, np.float32)
    bias_ids[0, 0], bias_values[0, 0] = 17, 100.0  # row 0 must pick 17
    top = logits[1].argmax()
    bias_ids[1, 0], bias_values[1, 0] = top, -np.inf  # row 1 may not pick its argmax
    result = run(logits, temperature=[0.0, 0.0, 1.0], bias_ids=bias_ids, bias_values=bias_values)
    tokens = np.asarray(result.tokens)
    assert tokens[0] == 17
    assert tokens[1] == np.argsort(-logits[1])[1]
    # an unbiased row draws exactly what it would have without any adjustment in the batch
    assert tokens[2] == np.asarray(run(logits, temperature=[0.0, 0.0, 1.0]).tokens)[2]


def test_min_p_keeps_only_tokens_near_the_most_likely() -> None:
    logits = np.full((64, VOCAB), -10.0, np.float32)
    logits[:, :3] = [2.0, 1.9, 0.0]  # probabilities relative to the top: 1, 0.905, 0.135
    result = run(logits, temperature=1.0, min_p=0.5, seeds=list(range(64)))
    drawn = set(np.asarray(result.tokens).tolist())
    assert drawn == {0, 1}
    assert set(np.asarray(run(logits, temperature=1.0, seeds=list(range(64))).tokens).tolist()) > {0, 1}
