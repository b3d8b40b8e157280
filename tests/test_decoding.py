"""The graph decoder (open_r1/decoding.py) against HF `generate`, on tiny models of every supported family.

On CPU the decoder runs its step uncompiled (the same function that is CUDA-graph-captured on GPUs), in float32, so
greedy tokens must equal `generate`'s exactly. The tiny checkpoints' weights are re-drawn with a larger spread so
that greedy decoding does not collapse onto one token (a constant output would hide position or cache errors).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from open_r1.decoding import (
    GraphDecoder,
    SamplingSettings,
    UnsupportedGeneration,
    check_zero3,
    choose_tokens,
    process_logits,
    resolve_settings,
)
from open_r1.errors import RecipeError

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
QUESTIONS = ["How many?", "Count the red cubes and the blue spheres in the picture, carefully.", "n?"]


def strip_after_eos(completion_ids: torch.Tensor, eos_token_ids) -> list[list[int]]:
    """Rows of completion ids cut after their first EOS (kept), as TRL's masking does."""
    eos = {eos_token_ids} if isinstance(eos_token_ids, int) else set(eos_token_ids)
    rows = []
    for row in completion_ids.tolist():
        for i, token in enumerate(row):
            if token in eos:
                row = row[: i + 1]
                break
        rows.append(row)
    return rows


def cache_address(decoder) -> int:
    """Address of the first layer's key tensor: the same after a call means the cache was reused, not reallocated."""
    return decoder.cache.layers[0].keys.data_ptr()


def _build(family, out_dir):
    from open_r1 import tiny_models

    if hasattr(tiny_models, "build_tiny"):
        return tiny_models.build_tiny(family, out_dir, seed=0)
    if family != "qwen2_vl":
        pytest.skip("open_r1.tiny_models.build_tiny is not available for this family")
    return tiny_models.build_qwen2vl(out_dir, seed=0)


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, tmp_path_factory):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    path = _build(request.param, tmp_path_factory.mktemp(request.param) / "model")
    processor = AutoProcessor.from_pretrained(path, padding_side="left")
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * (0.5 / param.shape[-1] ** 0.5))
        # an LM head of its own: tied to the embedding, a random model mostly repeats its input token
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(torch.randn(head.weight.shape, generator=generator))
    return request.param, model, processor


def _images(n, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 255, (56 + 28 * (i % 3), 84, 3), dtype=np.uint8)) for i in range(n)]


def _inputs(processor, questions, images=True, seed=0):
    texts = []
    for q in questions:
        content = ([{"type": "image"}] if images else []) + [{"type": "text", "text": q}]
        texts.append(processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True))
    kwargs = {"images": _images(len(questions), seed)} if images else {}
    return processor(text=texts, padding=True, padding_side="left", return_tensors="pt", **kwargs)


def _hf(model, inputs, **kwargs):
    with torch.no_grad():
        out = model.generate(**inputs, **kwargs)
    return out[:, inputs["input_ids"].shape[1] :]


def _ours(decoder, inputs, **kwargs):
    settings = resolve_settings(decoder.model.generation_config, **kwargs)
    return decoder.generate(**inputs, settings=settings)


def _same_rows(hf_ids, our_ids, eos):
    return strip_after_eos(hf_ids, eos) == strip_after_eos(our_ids, eos)


def test_greedy_tokens_equal_generate_with_images_and_mixed_lengths(family_model):
    family, model, processor = family_model
    inputs = _inputs(processor, QUESTIONS)
    assert len(set(inputs["attention_mask"].sum(1).tolist())) > 1  # mixed prompt lengths: left padding is used
    kwargs = dict(max_new_tokens=12, do_sample=False, eos_token_id=[-5], pad_token_id=processor.tokenizer.pad_token_id)
    reference = _hf(model, inputs, **kwargs)
    assert len(set(reference.flatten().tolist())) > 3, "degenerate reference: the test would not see errors"
    ours = _ours(GraphDecoder(model), inputs, **kwargs)
    assert torch.equal(ours, reference)


def test_positions_precomputed_on_the_cpu_give_the_same_tokens_also_in_a_padded_batch(family_model):
    """rope_positions (the model's get_rope_index on the processor's CPU tensors) handed to the decoder gives the
    tokens of the prefill computing them itself and of HF generate, also when the batch is padded to the cache's
    rows with dummy rows (a 2-row call after a 3-row one)."""
    from open_r1.decoding import rope_positions

    family, model, processor = family_model
    kwargs = dict(max_new_tokens=10, do_sample=False, eos_token_id=[-5], pad_token_id=processor.tokenizer.pad_token_id)
    decoder = GraphDecoder(model)
    for questions in (QUESTIONS, QUESTIONS[1:]):
        inputs = _inputs(processor, questions, seed=2)
        given = rope_positions(model, inputs)
        assert given is not None and given["position_ids"].shape == (3, *inputs["input_ids"].shape)
        assert bool((given["rope_deltas"] != 0).any())  # image rows: M-RoPE positions differ from 0..n-1
        reference = _hf(model, inputs, **kwargs)
        settings = resolve_settings(model.generation_config, **kwargs)
        with_given = decoder.generate(**inputs, **given, settings=settings)
        assert decoder.batch_size == len(QUESTIONS)
        assert torch.equal(with_given, reference)
        assert torch.equal(decoder.generate(**inputs, settings=settings), reference)
    assert rope_positions(model, _inputs(processor, QUESTIONS, images=False)) is None  # text only: the default


def test_early_eos_stops_rows_and_pads_after(family_model):
    family, model, processor = family_model
    inputs = _inputs(processor, QUESTIONS, seed=1)
    pad = processor.tokenizer.pad_token_id
    free = _hf(model, inputs, max_new_tokens=12, do_sample=False, eos_token_id=[-5], pad_token_id=pad)
    stop = int(free[0, 3])  # row 0 ends at step 3 (or earlier if the token came sooner); others maybe never
    kwargs = dict(max_new_tokens=12, do_sample=False, eos_token_id=[stop], pad_token_id=pad)
    reference = _hf(model, inputs, **kwargs)
    decoder = GraphDecoder(model, check_every=4)
    ours = _ours(decoder, inputs, **kwargs)
    assert _same_rows(reference, ours, [stop])
    row0 = strip_after_eos(ours, [stop])[0]
    assert row0[-1] == stop and len(row0) <= 4
    assert ours[0, len(row0) :].eq(pad).all()  # finished rows emit padding
    # every row finishing early ends the loop at the next check (every 4 steps), not at max_new_tokens
    all_stop = _hf(model, inputs, max_new_tokens=1, do_sample=False, eos_token_id=[-5], pad_token_id=pad)[:, 0]
    kwargs["eos_token_id"] = sorted(set(all_stop.tolist()))
    short = _ours(decoder, inputs, **kwargs)
    assert short.shape[1] == 4
    assert _same_rows(_hf(model, inputs, **kwargs), short, kwargs["eos_token_id"])


def test_text_only_prompts_match_generate(family_model):
    family, model, processor = family_model
    if family != "qwen2_vl":
        pytest.skip("one family suffices for the text-only path")
    inputs = _inputs(processor, QUESTIONS, images=False)
    kwargs = dict(max_new_tokens=8, do_sample=False, eos_token_id=[-5], pad_token_id=processor.tokenizer.pad_token_id)
    assert torch.equal(_ours(GraphDecoder(model), inputs, **kwargs), _hf(model, inputs, **kwargs))


def test_cache_is_reused_and_grown_once_for_a_longer_prompt(family_model):
    family, model, processor = family_model
    if family != "qwen2_vl":
        pytest.skip("cache management is family-independent")
    pad = processor.tokenizer.pad_token_id
    kwargs = dict(max_new_tokens=6, do_sample=False, eos_token_id=[-5], pad_token_id=pad)
    decoder = GraphDecoder(model, cache_margin=0, cache_bucket=8)
    first = _inputs(processor, QUESTIONS)
    assert torch.equal(_ours(decoder, first, **kwargs), _hf(model, first, **kwargs))
    pointer, length = cache_address(decoder), decoder.max_cache_len
    # a second round, different images, fewer rows (padded to the cache's batch): same tensors, same tokens
    second = _inputs(processor, QUESTIONS[:2], seed=3)
    assert torch.equal(_ours(decoder, second, **kwargs), _hf(model, second, **kwargs))
    assert cache_address(decoder) == pointer and decoder.allocations == 1 and decoder.calls == 2
    # a prompt longer than the cache holds: reallocated once (bigger), not crashed, still exact
    long_question = "Count every object: " + "cubes and spheres and cylinders, " * 8
    third = _inputs(processor, [long_question, "n?"], seed=4)
    assert third["input_ids"].shape[1] + 6 > length
    assert torch.equal(_ours(decoder, third, **kwargs), _hf(model, third, **kwargs))
    assert decoder.allocations == 2 and decoder.max_cache_len >= third["input_ids"].shape[1] + 6
    pointer = cache_address(decoder)
    _ours(decoder, first, **kwargs)
    assert decoder.allocations == 2 and cache_address(decoder) == pointer


def test_top_k_1_sampling_equals_greedy(family_model):
    family, model, processor = family_model
    if family != "qwen2_vl":
        pytest.skip("sampling is family-independent")
    inputs = _inputs(processor, QUESTIONS)
    base = dict(max_new_tokens=8, eos_token_id=[-5], pad_token_id=processor.tokenizer.pad_token_id)
    torch.manual_seed(0)
    sampled = _ours(GraphDecoder(model), inputs, do_sample=True, top_k=1, temperature=0.7, **base)
    assert torch.equal(sampled, _hf(model, inputs, do_sample=False, **base))


def _draw(logits_row, settings, n=20000, seed=0):
    logits = logits_row.expand(n, -1).clone()
    vocab = logits.shape[-1]
    processed = process_logits(
        logits, settings, torch.zeros(vocab, dtype=torch.bool), torch.zeros(vocab, dtype=torch.bool), torch.tensor(0)
    )
    return choose_tokens(processed, settings, generator=torch.Generator().manual_seed(seed))


def _frequencies(samples, vocab):
    return torch.bincount(samples, minlength=vocab).double() / samples.numel()


def _assert_matches(freq, probs, n):
    sigma = (probs * (1 - probs) / n).sqrt()
    assert ((freq - probs).abs() <= 5 * sigma + 1e-9).all(), (freq, probs)


LOGITS = torch.linspace(2.0, -2.0, 12)


def test_sampling_follows_the_softmax_and_temperature():
    n = 20000
    for temperature in (1.0, 0.5, 2.0):
        settings = SamplingSettings(max_new_tokens=1, do_sample=True, temperature=temperature)
        freq = _frequencies(_draw(LOGITS, settings, n), 12)
        _assert_matches(freq, (LOGITS.double() / temperature).softmax(-1), n)
    # temperature changes the distribution the way it should: colder puts more mass on the top token
    cold = _frequencies(_draw(LOGITS, SamplingSettings(max_new_tokens=1, do_sample=True, temperature=0.5)), 12)
    hot = _frequencies(_draw(LOGITS, SamplingSettings(max_new_tokens=1, do_sample=True, temperature=2.0)), 12)
    assert cold[0] > 0.5 > hot[0] and hot[-1] > cold[-1]


def test_top_k_and_top_p_never_emit_outside_their_set_and_renormalise():
    n = 20000
    shuffled = LOGITS[torch.randperm(12, generator=torch.Generator().manual_seed(0))]
    settings = SamplingSettings(max_new_tokens=1, do_sample=True, top_k=4)
    samples = _draw(shuffled, settings, n)
    top4 = set(torch.topk(shuffled, 4).indices.tolist())
    assert set(samples.tolist()) == top4
    expected = torch.full((12,), float("-inf"), dtype=torch.float64)
    expected[list(top4)] = shuffled.double()[list(top4)]
    _assert_matches(_frequencies(samples, 12), expected.softmax(-1), n)
    # top-p: the smallest set whose probability reaches p (HF's rule), here the top 3 of this distribution
    probs = shuffled.double().softmax(-1)
    order = probs.argsort(descending=True)
    p = float(probs[order[:3]].sum()) - 1e-3
    nucleus = _draw(shuffled, SamplingSettings(max_new_tokens=1, do_sample=True, top_p=p), n)
    assert set(nucleus.tolist()) == set(order[:3].tolist())
    # min-p: tokens below min_p x the top probability are never drawn
    min_p = _draw(shuffled, SamplingSettings(max_new_tokens=1, do_sample=True, min_p=0.5), n)
    assert set(min_p.tolist()) == set((probs >= 0.5 * probs.max()).nonzero().flatten().tolist())


def test_min_new_tokens_and_suppressed_tokens_are_never_chosen():
    vocab = 12
    settings = SamplingSettings(
        max_new_tokens=4, do_sample=False, min_new_tokens=2, eos_token_ids=(0,), suppress_tokens=(1,)
    )
    suppress = torch.zeros(vocab, dtype=torch.bool)
    suppress[1] = True
    eos = torch.zeros(vocab, dtype=torch.bool)
    eos[0] = True
    logits = LOGITS.expand(3, -1).clone()  # token 0 is the largest, token 1 the second
    assert process_logits(logits, settings, suppress, eos, torch.tensor(1)).argmax(-1).eq(2).all()
    assert process_logits(logits, settings, suppress, eos, torch.tensor(2)).argmax(-1).eq(0).all()


def test_unsupported_settings_and_zero3_are_refused():
    with pytest.raises(UnsupportedGeneration, match="repetition_penalty"):
        resolve_settings(None, max_new_tokens=4, repetition_penalty=1.2)
    with pytest.raises(UnsupportedGeneration, match="max_new_tokens"):
        resolve_settings(None, do_sample=False)
    settings = resolve_settings(
        None,
        max_new_tokens=4,
        do_sample=True,
        top_k=0,
        top_p=1.0,
        min_p=None,
        repetition_penalty=1.0,
        eos_token_id=[5, 6],
        suppress_tokens=[7],
    )
    assert settings.top_k == 0 and settings.top_p == 1.0 and settings.eos_token_ids == (5, 6)

    sharded = torch.nn.Linear(2, 2)
    sharded.weight.ds_id = 0  # what DeepSpeed ZeRO-3 marks its partitioned parameters with
    with pytest.raises(RecipeError, match="decoder .hf. here"):
        check_zero3(sharded)
    check_zero3(torch.nn.Linear(2, 2))


def test_training_rollouts_go_through_the_decoder_at_trls_generate_call(
    tiny_model_dir, scene_data_dir, tmp_path, monkeypatch
):
    """open_r1.grpo's trainer with fast_decode=eager (the graph decoder uncompiled, on CPU): TRL's rollout path
    calls the decoder instead of HF generate, a round trains, and the cache is allocated once over two rounds."""
    from open_r1 import grpo
    from open_r1.decoding import GraphDecoder
    from tests.test_grpo import recipe_args, use_varied_reward

    use_varied_reward(monkeypatch)
    calls = []
    original = GraphDecoder.generate

    def spy(self, *args, **kwargs):
        calls.append(kwargs["settings"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GraphDecoder, "generate", spy)
    script_args, training_args, model_args, task = grpo.parse_args(
        recipe_args(tiny_model_dir, scene_data_dir, tmp_path, "--fast_decode", "eager", "--max_steps", "2")
    )
    trainer = grpo.build_trainer(script_args, training_args, model_args, task)
    trainer.train()
    assert len(calls) == 2 and calls[0].do_sample and calls[0].max_new_tokens == training_args.max_completion_length
    decoder = trainer._graph_decoder
    assert decoder.allocations == 1 and decoder.calls == 2 and not decoder.compile
    assert "generate" not in trainer.model.__dict__  # the hook is removed after each call


def test_fast_decode_is_taken_under_zero3_and_auto_falls_back_on_cpu(
    tiny_model_dir, scene_data_dir, tmp_path, monkeypatch
):
    """Under ZeRO-3 the trainer decodes from a whole-weight copy (tests/test_trainer.py), so nothing is refused."""
    from open_r1 import grpo
    from open_r1 import trainer as trainer_lib
    from tests.test_grpo import recipe_args

    script_args, training_args, model_args, task = grpo.parse_args(
        recipe_args(tiny_model_dir, scene_data_dir, tmp_path)
    )
    trainer = grpo.build_trainer(script_args, training_args, model_args, task)
    assert trainer.fast_decode is None and trainer.rollout_generator() is None  # auto on CPU: HF generate

    class Plugin:
        zero_stage = 3

    monkeypatch.setattr(type(trainer.accelerator.state), "deepspeed_plugin", Plugin(), raising=False)
    assert trainer_lib.resolve_fast_decode(True, trainer) == "eager"  # CPU: the same decoder uncompiled
    assert trainer_lib.resolve_fast_decode("auto", trainer) is None


def test_gqa_decode_attention_equals_the_repeat_kv_path_transformers_takes_under_compile(monkeypatch):
    """The captured step's attention (`gqa_decode_sdpa`: query heads packed per KV head) against transformers' own
    sdpa on the path it takes while dynamo traces (KV heads repeated): same output, masked positions ignored."""
    import transformers.integrations.sdpa_attention as sdpa_lib

    from open_r1 import decoding

    class Layer(torch.nn.Module):
        num_key_value_groups = 6
        is_causal = True

    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 12, 1, 16, generator=generator)
    key = torch.randn(3, 2, 10, 16, generator=generator)
    value = torch.randn(3, 2, 10, 16, generator=generator)
    mask = torch.ones(3, 1, 1, 10, dtype=torch.bool)
    mask[0, ..., :4] = False  # left padding
    mask[:, ..., 8:] = False  # static-cache slots not written yet
    monkeypatch.setattr(sdpa_lib, "is_torchdynamo_compiling", lambda: True)  # transformers' compiled path
    reference, _ = sdpa_lib.sdpa_attention_forward(Layer(), query, key, value, mask, scaling=0.25)
    monkeypatch.setattr(decoding, "_ORIGINAL_SDPA", sdpa_lib.sdpa_attention_forward)
    ours, _ = decoding.gqa_decode_sdpa(Layer(), query, key, value, mask, scaling=0.25)
    assert ours.shape == reference.shape == (3, 1, 12, 16)
    assert torch.allclose(ours, reference, atol=1e-6)
    garbage = key.clone()
    garbage[:, :, 8:] = 1e4  # what sits in masked slots does not matter
    again, _ = decoding.gqa_decode_sdpa(Layer(), query, garbage, value, mask, scaling=0.25)
    assert torch.allclose(again, ours, atol=1e-6)
    # prompts (more than one query token) go to transformers' function untouched
    calls = []
    monkeypatch.setattr(decoding, "_ORIGINAL_SDPA", lambda *a, **k: calls.append(1) or (None, None))
    decoding.gqa_decode_sdpa(Layer(), torch.randn(3, 12, 4, 16), key, value, None)
    assert calls == [1]


def _tiny_batch(tiny_model_dir):
    """The tiny checkpoint (fp32, eval), its left-padding processor, and one chat prompt + image per question."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_model_dir, padding_side="left")
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    texts = [
        processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}], add_generation_prompt=True
        )
        for q in QUESTIONS
    ]
    return model, processor, texts, _images(len(texts))


def test_generate_texts_decoder_option_gives_hf_answers_and_refuses_zero3(tiny_model_dir, monkeypatch):
    """generate_texts (what selfcheck / evaluate_dataset call): decoder='eager' (the graph decoder's code path,
    uncompiled) returns HF generate's texts, lengths and truncation flags; a ZeRO-3-partitioned model falls back
    to HF under 'auto' and is refused for an explicit graph decoder."""
    from open_r1 import decoding, generation

    model, processor, texts, images = _tiny_batch(tiny_model_dir)
    hf = generation.generate_texts(model, processor, texts, images, 6, decoder="hf")
    ours = generation.generate_texts(model, processor, texts, images, 6, decoder="eager")
    assert ours == hf
    decoder = generation.decoder_for(model)
    assert decoder.calls == 1 and not decoder.compile
    for choice in ("eager", "hf"):  # positions precomputed with the batch (prefetch): used by ours, dropped by HF's
        inputs = generation.prepare_inputs(processor, texts, images, rope_model=model)
        assert {"position_ids", "rope_deltas"} <= set(inputs)
        assert generation.generate_texts(model, processor, None, None, 6, decoder=choice, inputs=inputs) == hf
    generation.generate_texts(model, processor, texts, images, 6, decoder="eager")
    assert generation.decoder_for(model) is decoder and decoder.allocations == 1  # one decoder per model, reused
    monkeypatch.setattr(decoding, "zero3_partitioned", lambda model: True)
    with pytest.raises(RecipeError, match="decoder .hf. here"):
        generation.generate_texts(model, processor, texts, images, 6, decoder="eager")
    monkeypatch.setattr(generation, "DEFAULT_DECODER", "auto")
    assert generation.generate_texts(model, processor, texts, images, 6) == hf
    assert decoder.calls == 3  # the eager calls above; the ZeRO-3 fallback went to HF
    generation.forget_decoders()


def _hf_warped(logits, temperature=1.0, top_k=0, top_p=1.0, min_tokens_to_keep=1):
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    if temperature != 1.0:
        logits = TemperatureLogitsWarper(temperature)(None, logits)
    if top_k:
        logits = TopKLogitsWarper(top_k, min_tokens_to_keep=min_tokens_to_keep)(None, logits)
    return TopPLogitsWarper(top_p, min_tokens_to_keep=min_tokens_to_keep)(None, logits)


def _fixed_logits():
    """Rows of a 3000-token vocabulary: peaked (a nucleus of a few tokens), flat (a nucleus of thousands: more than
    the pairwise path's k, the case a top-k-only filter would get wrong), with -inf entries, and with ties inside the
    nucleus (several tokens of one logit, all above the cut)."""
    generator = torch.Generator().manual_seed(0)
    peaked = torch.randn(3000, generator=generator) * 4
    flat = torch.randn(3000, generator=generator) * 0.05
    masked = torch.randn(3000, generator=generator) * 2
    masked[::3] = float("-inf")
    tied = torch.randn(3000, generator=generator)
    tied[[5, 17, 40, 41]] = 6.0  # the four most probable tokens, tied
    return torch.stack([peaked, flat, masked, tied])


@pytest.mark.parametrize(
    "temperature,top_k,top_p,min_keep",
    [
        (1.0, 0, 0.95, 1),
        (0.7, 0, 0.9, 1),
        (0.7, 20, 0.95, 1),
        (1.3, 300, 0.8, 1),
        (1.0, 0, 0.5, 3),
        (0.7, 8, 0.9, 2),
        (1.0, 2999, 0.999, 1),
    ],
)
def test_top_p_filter_equals_hfs_warpers_on_fixed_logits(temperature, top_k, top_p, min_keep):
    """`top_p_filter` (no sort, no full-vocabulary cumsum: what the compiled step runs) keeps exactly the tokens HF's
    Temperature -> TopK -> TopP warpers keep, on both of its paths (a top-k of at most PAIRWISE_TOP_K compared
    pairwise; otherwise the bisection), including a nucleus of thousands of tokens, -inf entries, ties inside the
    nucleus and min_tokens_to_keep."""
    from open_r1.decoding import top_p_filter

    logits = _fixed_logits()
    expected = _hf_warped(logits, temperature, top_k, top_p, min_keep)
    settings = SamplingSettings(max_new_tokens=1, do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
    off = torch.zeros(logits.shape[-1], dtype=torch.bool)
    if min_keep == 1:
        ours = process_logits(logits, settings, off, off, torch.tensor(0))
    else:  # the decoder never sets it (HF uses 2 only for beam search); the filter takes it like HF's warper
        warped = _hf_warped(logits, temperature, top_k, 1.0, min_keep)
        ours = top_p_filter(warped, top_p, top_k, min_tokens_to_keep=min_keep)
    assert torch.equal(ours, expected)
    kept = torch.isfinite(expected).sum(-1)
    if (top_k, top_p) == (0, 0.95):
        assert kept[1] > 2000 and kept[0] < 100  # the flat row's nucleus is thousands of tokens, the peaked one few


def test_top_p_filter_keeps_a_tie_that_straddles_the_cut_whole():
    """The documented rule where HF's sort decides arbitrarily: tokens of one logit share one fate, so a tie that
    the nucleus boundary cuts through is kept whole (HF keeps some of it)."""
    from open_r1.decoding import top_p_filter

    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0, -1.0, -3.0]])
    probs = logits.softmax(-1)[0]
    top_p = float(probs[0] + probs[1]) + 1e-3  # the cut falls inside the tie of tokens 1-3
    for top_k in (0, 4):
        kept = torch.isfinite(top_p_filter(logits, top_p, top_k))[0].tolist()
        assert kept == [True, True, True, True, False, False]
    hf_kept = torch.isfinite(_hf_warped(logits, top_p=top_p))[0]
    assert hf_kept[0] and 2 <= int(hf_kept[1:4].sum()) < 3  # HF: part of the tie, by sort order


def test_top_p_sampling_runs_inside_the_compiled_step_and_follows_the_filtered_softmax():
    """The sampler (process_logits with top-k / top-p, then Gumbel-max) traces into ONE graph (fullgraph=True: no
    graph break, no fallback), and the compiled draws follow softmax of HF's filtered logits."""
    n, vocab = 20000, 12
    shuffled = LOGITS[torch.randperm(vocab, generator=torch.Generator().manual_seed(0))]
    off = torch.zeros(vocab, dtype=torch.bool)
    for settings in (
        SamplingSettings(max_new_tokens=1, do_sample=True, temperature=0.7, top_p=0.8),
        SamplingSettings(max_new_tokens=1, do_sample=True, temperature=1.5, top_k=6, top_p=0.6),
    ):

        def sample(x):
            return choose_tokens(process_logits(x, settings, off, off, torch.tensor(0)), settings)

        compiled = torch.compile(sample, backend="eager", fullgraph=True)
        torch.manual_seed(3)  # the decode step draws from the global generator (dynamo does not take one as input)
        samples = compiled(shuffled.expand(n, -1).clone())
        expected = _hf_warped(shuffled[None], settings.temperature, settings.top_k, settings.top_p)[0]
        probs = expected.double().softmax(-1)
        assert set(samples.tolist()) == set(torch.isfinite(expected).nonzero().flatten().tolist())
        _assert_matches(_frequencies(samples, vocab), probs, n)


def test_top_p_sampling_uses_the_compiled_decoder_with_no_fallback(tiny_model_dir, monkeypatch):
    """A compiled graph decoder samples top-p itself (no UnsupportedGeneration, no warning, no HF generate): the
    step under torch.compile (dynamo's trace with the eager backend on CPU) draws the same seeded tokens as the
    uncompiled step, and generate_texts(decoder='graph') with top_p goes through the decoder."""
    import warnings

    from open_r1 import decoding, generation

    graphs = []

    def recording_backend(graph_module, example_inputs):  # dynamo's trace, run as traced (no inductor on CPU)
        graphs.append(graph_module)
        return graph_module.forward

    monkeypatch.setattr(decoding, "COMPILE_OPTIONS", {"backend": recording_backend, "dynamic": False})
    model, processor, texts, images = _tiny_batch(tiny_model_dir)
    inputs = generation.prepare_inputs(processor, texts, images)
    sampling = dict(max_new_tokens=6, do_sample=True, temperature=0.7, top_p=0.9, top_k=0, eos_token_id=[-5])
    settings = resolve_settings(model.generation_config, **sampling)
    torch.manual_seed(0)
    eager = GraphDecoder(model, compile=False).generate(**inputs, settings=settings)
    torch.manual_seed(0)
    compiled = GraphDecoder(model, compile=True).generate(**inputs, settings=settings)
    assert len(graphs) == 1  # the step was traced whole (no graph break) and ran compiled
    assert torch.equal(compiled, eager)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to HF generate warns
        generation.generate_texts(
            model, processor, texts, images, 6, decoder="graph", do_sample=True, temperature=0.7, top_p=0.9
        )
    decoder = generation.decoder_for(model)
    assert decoder.compile and decoder.calls == 1
    generation.forget_decoders()


def test_out_of_memory_drops_the_decoder_so_a_smaller_retry_gets_a_smaller_cache(tiny_model_dir, monkeypatch):
    from open_r1 import generation
    from open_r1.decoding import GraphDecoder

    model, processor, texts, images = _tiny_batch(tiny_model_dir)
    first = generation.decoder_for(model, compile=False)
    monkeypatch.setattr(GraphDecoder, "generate", lambda self, *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError()))
    with pytest.raises(torch.OutOfMemoryError):
        generation.generate_texts(model, processor, texts, images, 4, decoder="eager")
    monkeypatch.undo()
    out = generation.generate_texts(model, processor, texts[:1], images[:1], 4, decoder="eager")
    again = generation.decoder_for(model)
    assert again is not first and again.batch_size == 1 and len(out[0]) == 1
    generation.forget_decoders()


def test_a_tiny_models_suppressed_ids_are_never_sampled_by_generate_or_the_decoder(family_model):
    """A stand-in policy suppresses the ids no text encodes to (tiny_models.unused_token_ids, build_tiny's
    suppress_unused); with this random head those are ~98 % of the probability, so a sampler that ignored the list
    would pick them at once."""
    from open_r1.tiny_models import unused_token_ids

    family, model, processor = family_model
    suppressed = set(unused_token_ids(processor.tokenizer, model.config.get_text_config().vocab_size))
    model.generation_config.suppress_tokens = sorted(suppressed)  # restored below: the fixture is shared
    inputs = _inputs(processor, QUESTIONS, seed=3)
    kwargs = dict(
        max_new_tokens=6,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        eos_token_id=[-5],
        pad_token_id=processor.tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    try:
        hf = _hf(model, inputs, **kwargs)
        ours = _ours(GraphDecoder(model), inputs, **kwargs)
    finally:
        model.generation_config.suppress_tokens = None
    assert not suppressed & set(hf.flatten().tolist()) and not suppressed & set(ours.flatten().tolist())
    unsuppressed = _ours(GraphDecoder(model), inputs, **kwargs)
    assert suppressed & set(unsuppressed.flatten().tolist())  # the list is what keeps them out


def test_layers_once_traces_one_nested_region_for_every_layer_and_keeps_the_tokens(tiny_model_dir):
    """compile_layers_once (the shorter first compile): the compiled step's graph calls ONE nested compile region
    (invoke_subgraph) for the decoder layers instead of inlining each, and the tokens stay HF generate's; outside
    torch.compile the marked layers are plain calls (the uncompiled decoder gives the same tokens)."""
    from open_r1.decoding import compile_layers_once

    model, processor, texts, images = _tiny_batch(tiny_model_dir)
    inputs = _inputs(processor, QUESTIONS)
    kwargs = dict(max_new_tokens=6, do_sample=False, eos_token_id=[-5], pad_token_id=processor.tokenizer.pad_token_id)
    reference = _hf(model, inputs, **kwargs)
    graphs = []

    def recording_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    decoder = GraphDecoder(model, compile=True, layers_once=True, compile_options={"backend": recording_backend})
    assert torch.equal(_ours(decoder, inputs, **kwargs), reference)
    targets = [str(node.target) for graph in graphs for node in graph.graph.nodes if node.op == "call_function"]
    layers = model.config.get_text_config().num_hidden_layers
    assert layers > 1 and sum("invoke_subgraph" in t for t in targets) == layers
    assert compile_layers_once(model) == layers  # idempotent
    assert torch.equal(_ours(GraphDecoder(model, compile=False), inputs, **kwargs), reference)
