"""Build Qwen-VL checkpoints laid out like the real ones (files, classes, token ids, chat template, processor and
generation config), tiny or at full size with random weights, for tests, CPU demos and GPU benchmarks.

The real weights cannot be downloaded here, yet the code must run on the real loading path. `qwen2_vl`, `qwen2_5_vl`
and `qwen3_vl` are laid out like Qwen2-VL-2B-Instruct, Qwen2.5-VL-3B-Instruct and Qwen3-VL-2B-Thinking (or Instruct).
The tiny model keeps the real 151936-row embedding, and its BPE (trained here) is padded with placeholders up to the
real added-token ids, so ids mean what they mean in the real model. Weights are seeded per parameter name.

    open-r1-tiny-model --family qwen3_vl --out models/tiny-qwen3vl      # = python -m open_r1.tiny_models
"""

import functools
import inspect
import json
import math
import os
import zlib
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from open_r1.errors import ModelError, OpenR1Error, cli_parser, error_exit, setup_logging
from open_r1.families import SUPPORTED, get_family
from open_r1.jsonio import read_json, write_json
from open_r1.submission.install import check_target, installing

ASSETS = Path(__file__).with_name("tiny_assets")  # the BPE corpus and the chat templates


def _ids(first: int, names: str) -> dict[str, int]:
    return {name: first + i for i, name in enumerate(names.split())}


# The real added tokens in id order; tokenizer, config and processor rely on these ids. Qwen2.5 adds tool-call and
# fill-in-the-middle tokens, Qwen3 tool responses and the think tags; as in the real files only Qwen2-VL's 14 are
# "special" (decode keeps the others).
QWEN2VL_SPECIAL_TOKENS: dict[str, int] = _ids(
    151643,
    """<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|>
    <|object_ref_end|> <|box_start|> <|box_end|> <|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|>
    <|vision_pad|> <|image_pad|> <|video_pad|>""",
)
_QWEN2_5_VL_ADDED_TOKENS = {
    **QWEN2VL_SPECIAL_TOKENS,
    **_ids(
        151657,
        """<tool_call> </tool_call> <|fim_prefix|>
    <|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> <|file_sep|>""",
    ),
}
QWEN3_VL_ADDED_TOKENS: dict[str, int] = {
    **_QWEN2_5_VL_ADDED_TOKENS,
    **_ids(151665, "<tool_response> </tool_response> <think> </think>"),
}
ADDED_TOKENS = {
    "qwen2_vl": QWEN2VL_SPECIAL_TOKENS,
    "qwen2_5_vl": _QWEN2_5_VL_ADDED_TOKENS,
    "qwen3_vl": QWEN3_VL_ADDED_TOKENS,
}
FIRST_SPECIAL_TOKEN_ID = 151643  # = size of the real BPE vocabulary
REAL_VOCAB_SIZE = 151936  # embedding rows of the real model (padded past len(tokenizer))
PLACEHOLDER_TOKEN_FORMAT = "<|reserved_{}|>"  # fills BPE ids nothing encodes to, up to FIRST_SPECIAL_TOKEN_ID
BOS_TOKEN_ID = PAD_TOKEN_ID = QWEN2VL_SPECIAL_TOKENS["<|endoftext|>"]
EOS_TOKEN_ID = QWEN2VL_SPECIAL_TOKENS["<|im_end|>"]

# The chat template shipped with Qwen/Qwen2-VL-2B-Instruct (and Qwen2.5-VL-Instruct), verbatim.
QWEN2VL_CHAT_TEMPLATE = (ASSETS / "qwen2_vl.jinja").read_text().rstrip("\n")


def chat_template(family: str, thinking: bool = True) -> str:
    """The family's chat template; Qwen3-VL's (tiny_assets/qwen3_vl.jinja) as Thinking or Instruct."""
    if family != "qwen3_vl":
        return QWEN2VL_CHAT_TEMPLATE
    return f"{{%- set thinking = {str(thinking).lower()} -%}}\n" + (ASSETS / "qwen3_vl.jinja").read_text().rstrip("\n")


# The real generation_config.json files: Qwen2/2.5-VL effectively greedy (top_k 1), Qwen3-VL Thinking sampling (its
# model card's top_p 0.95, top_k 20). GRPO and the evaluation protocol set their own decoding.
_GENERATION_IDS = {
    "bos_token_id": BOS_TOKEN_ID,
    "pad_token_id": PAD_TOKEN_ID,
    "eos_token_id": [EOS_TOKEN_ID, BOS_TOKEN_ID],
}
REAL_GENERATION_CONFIG: dict[str, Any] = {
    **_GENERATION_IDS,
    "do_sample": True,
    "repetition_penalty": 1.0,
    "temperature": 0.01,
    "top_p": 0.001,
    "top_k": 1,
}
QWEN3_VL_GENERATION_CONFIG: dict[str, Any] = {
    **_GENERATION_IDS,
    "do_sample": True,
    "temperature": 1.0,
    "top_p": 0.95,
    "top_k": 20,
}
# The real preprocessor_config.json pixel budget of Qwen2/2.5-VL: 4 .. 16384 merged patches of 28x28.
REAL_MIN_PIXELS = 56 * 56
REAL_MAX_PIXELS = 28 * 28 * 16384
INITIALIZER_RANGE = 0.02
DEFAULT_BPE_VOCAB_SIZE = 4096  # upper bound; the small corpus runs out of merges first (~2.5k tokens)
BUILD_MARKER_FILE = "tiny_model.json"  # written into every built dir: how it was built (and that it may be rebuilt)
TRAINED_MARKERS = ("trainer_state.json", "training_meta.json", "adapter_config.json", "optimizer.pt")

# build_config's defaults: text-config fields, `vision_<field>` for the vision config, rope_theta,
# tie_word_embeddings, dtype. The vision merger's output width follows the text hidden_size; mrope_section, when
# left out, is derived from head_dim in the real ratio. Full sizes: the public config.json of each real checkpoint,
# less the fields where transformers' default already is the real value.
_TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 32768,
    "rope_theta": 1e6,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "dtype": "float32",
}  # fp32: bf16 CPU kernels are slow or missing
_TINY_VISION = {"vision_depth": 2, "vision_hidden_size": 32, "vision_intermediate_size": 64, "vision_num_heads": 4}
_FULL = {"rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True, "dtype": "bfloat16"}
_CLIP_MEAN_STD = ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711])

# Per family: build_config's tiny and full-size defaults, the real image processor's (min_pixels, max_pixels) and
# normalisation, the real tokenizer's model_max_length.
_Spec = namedtuple("_Spec", "tiny full pixels mean_std model_max_length")
_SPECS = {
    "qwen2_vl": _Spec(  # Qwen/Qwen2-VL-2B-Instruct
        tiny={**_TINY, "vision_depth": 2, "vision_embed_dim": 32, "vision_num_heads": 4, "vision_mlp_ratio": 4},
        full={
            **_FULL,
            "hidden_size": 1536,
            "num_hidden_layers": 28,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "intermediate_size": 8960,
            "vision_depth": 32,
        },
        pixels=(REAL_MIN_PIXELS, REAL_MAX_PIXELS),
        mean_std=_CLIP_MEAN_STD,
        model_max_length=32768,
    ),
    "qwen2_5_vl": _Spec(  # Qwen/Qwen2.5-VL-3B-Instruct: SwiGLU ViT with window attention
        # windows of 2 merged tokens per side: tiny images still see several windows
        tiny={
            **_TINY,
            **_TINY_VISION,
            "vision_window_size": 56,
            "vision_fullatt_block_indexes": [1],
            "vision_tokens_per_second": 2,
        },
        full={
            **_FULL,
            "hidden_size": 2048,
            "num_hidden_layers": 36,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "intermediate_size": 11008,
            "max_position_embeddings": 128000,
            "vision_depth": 32,
            "vision_hidden_size": 1280,
            "vision_fullatt_block_indexes": [7, 15, 23, 31],
            "vision_tokens_per_second": 2,
        },
        pixels=(REAL_MIN_PIXELS, REAL_MAX_PIXELS),
        mean_std=_CLIP_MEAN_STD,
        model_max_length=131072,
    ),
    "qwen3_vl": _Spec(  # Qwen/Qwen3-VL-2B-{Instruct,Thinking}: 16 px patches, deepstack, interleaved M-RoPE
        # An 8x8 learned position grid (real: 48x48). Deepstack feature k is added to decoder layer k's output: with
        # 2 layers a second one would reach only the last layer (no gradient from the answer); the real 28-layer
        # model has 3, well before its last layer.
        tiny={
            **_TINY,
            **_TINY_VISION,
            "head_dim": 16,
            "rope_theta": 5e6,
            "vision_num_position_embeddings": 64,
            "vision_deepstack_visual_indexes": [0],
        },
        full={
            **_FULL,
            "hidden_size": 2048,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "intermediate_size": 6144,
            "max_position_embeddings": 262144,
            "rope_theta": 5e6,
            "mrope_section": [24, 20, 20],
            "vision_depth": 24,
            "vision_hidden_size": 1024,
            "vision_intermediate_size": 4096,
            "vision_deepstack_visual_indexes": [5, 11, 17],
        },
        pixels=(65536, 16777216),
        mean_std=([0.5] * 3, [0.5] * 3),
        model_max_length=262144,
    ),  # 64 .. 16384 tokens
}


def tokenizer_training_corpus() -> list[str]:
    """The text the BPE is trained on (data in tiny_assets/corpus.json): counting prompts in both wordings, answers,
    numbers, simple English, and common words lower-case and capitalised, mid-sentence as BPE sees most words."""
    corpus = read_json(ASSETS / "corpus.json")
    words = " ".join(corpus["common_words"]).split()
    lines = list(corpus["simple_english"])
    for start in range(0, len(words), 12):
        chunk = words[start : start + 12]
        lines += [" ".join(chunk) + ".", " ".join(word.capitalize() for word in chunk) + "?"]
    for index, (singular, plural) in enumerate(corpus["objects"]):
        color = corpus["colors"][index % len(corpus["colors"])]
        material = corpus["materials"][index % len(corpus["materials"])]
        for question in corpus["counting_questions"]:
            lines.extend(question.format(plural=plural, color=color) + suffix for suffix in corpus["prompt_suffixes"])
        count = index % 11
        lines.append(
            f"<think> I see {count} {plural if count != 1 else singular}: the {color} {material} {singular} and "
            f"the others. Counting them gives {count}. </think> <answer> {count} </answer>"
        )
        lines.append(f"There is a {material} {color} {singular} in the image.")
    # Digits are split one per token by Qwen2's pre-tokenizer; numbers still teach digit/space merges.
    lines.append(" ".join(str(number) for number in range(0, 101)))
    lines.append("<answer> 0 </answer> <answer>1</answer> <answer> 10 </answer> <think>\n</think>\n")
    return lines


def train_byte_level_bpe(vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a byte-level BPE with Qwen2's normaliser and pre-tokenizer; return its vocab and merges."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    # Every byte encodes, as in Qwen2; the added tokens come after the placeholders, at their real ids.
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(tokenizer_training_corpus(), trainer)
    model_json = json.loads(bpe.to_str())["model"]
    merges = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in model_json["merges"]]
    return dict(model_json["vocab"]), merges


def _family(family: str):
    return get_family(family, where=f"the tiny-model family {family!r}")


def build_tokenizer(bpe_vocab_size: int = DEFAULT_BPE_VOCAB_SIZE, family: str = "qwen2_vl", thinking: bool = True):
    """The family's `Qwen2Tokenizer`: the small trained BPE, padded with placeholders (in the vocab, but no merge
    produces them) up to the real added-token ids."""
    _family(family)
    vocab, merges = train_byte_level_bpe(bpe_vocab_size)
    if len(vocab) >= FIRST_SPECIAL_TOKEN_ID:
        raise ValueError(f"trained BPE has {len(vocab)} tokens; it must stay below {FIRST_SPECIAL_TOKEN_ID}")
    vocab.update({PLACEHOLDER_TOKEN_FORMAT.format(i): i for i in range(len(vocab), FIRST_SPECIAL_TOKEN_ID)})
    if len(vocab) != FIRST_SPECIAL_TOKEN_ID:
        raise AssertionError("placeholder names collided with trained tokens")
    return qwen2_tokenizer(
        vocab,
        merges,
        ADDED_TOKENS[family],
        chat_template(family, thinking),
        model_max_length=_SPECS[family].model_max_length,
    )


def qwen2_tokenizer(
    vocab: dict[str, int], merges: list, added: dict[str, int], chat_template: str, model_max_length: int
):
    """A `Qwen2Tokenizer` with Qwen2's settings over a BPE (`vocab`, `merges`) with the `added` tokens at their ids
    (special where the real files mark them special); the ids are checked."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    special = [token for token in added if token in QWEN2VL_SPECIAL_TOKENS]
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        # Passing the ids makes them added in id order, right after the vocab: exactly the ids asked for.
        added_tokens_decoder={
            token_id: AddedToken(token, special=token in special, normalized=False) for token, token_id in added.items()
        },
        extra_special_tokens=special[1:],  # the real `additional_special_tokens`
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        errors="replace",
        split_special_tokens=False,
        chat_template=chat_template,
    )
    got = dict(zip(added, tokenizer.convert_tokens_to_ids(list(added))))
    wrong = {token: token_id for token, token_id in got.items() if token_id != added[token]}
    if wrong:
        raise AssertionError(f"special tokens got the wrong ids: {wrong}")
    return tokenizer


def build_processor(
    tokenizer=None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    family: str = "qwen2_vl",
    thinking: bool = True,
):
    """The family's processor: the tokenizer and the real image-processor settings (pixel budget overridable)."""
    import transformers

    record, spec = _family(family), _SPECS[family]
    if tokenizer is None:
        tokenizer = build_tokenizer(family=family, thinking=thinking)
    min_pixels = spec.pixels[0] if min_pixels is None else min_pixels
    max_pixels = spec.pixels[1] if max_pixels is None else max_pixels
    # A fresh `size` dict, not min_pixels=/max_pixels=: in 5.17 those write into the class-level default dict,
    # leaking into every later Qwen2VLImageProcessor. All three families use this class (Qwen3-VL: 16 px patches).
    image_processor = transformers.Qwen2VLImageProcessor(
        size={"shortest_edge": int(min_pixels), "longest_edge": int(max_pixels)},
        patch_size=record.patch_size,
        temporal_patch_size=2,
        merge_size=record.merge_size,
        image_mean=list(spec.mean_std[0]),
        image_std=list(spec.mean_std[1]),
    )
    video_processor = transformers.Qwen3VLVideoProcessor if family == "qwen3_vl" else transformers.Qwen2VLVideoProcessor
    return getattr(transformers, record.processor_class)(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor(),
        chat_template=chat_template(family, thinking),
    )


def _default_mrope_section(head_dim: int, family: str) -> list[int]:
    """head_dim/2 rotary frequencies as (temporal, height, width) in the real ratio: 16, 24, 24 of 64 (Qwen2/2.5-VL);
    Qwen3-VL interleaves them and gives temporal the most, 24, 20, 20 of 64."""
    half = head_dim // 2
    if family == "qwen3_vl":
        spatial = max(1, half // 4)
        return [half - 2 * spatial, spatial, spatial]
    temporal = half // 4
    height = (half - temporal) // 2
    return [temporal, height, half - temporal - height]


def _config_fields(config_class) -> set[str]:
    # Configs accept unknown kwargs silently; checking names catches a typo'd override.
    return set(inspect.signature(config_class.__init__).parameters) - {"self", "kwargs"}


def _check_vision(vision: dict[str, Any]) -> None:
    depth = vision["depth"]
    for key in ("fullatt_block_indexes", "deepstack_visual_indexes"):
        bad = [i for i in vision.get(key, []) if i not in range(depth)]
        if bad:
            raise ValueError(f"vision_{key} {bad} are outside range(vision_depth={depth})")
    positions = int(vision.get("num_position_embeddings", 1))
    if round(positions**0.5) ** 2 != positions:
        raise ValueError(
            f"vision_num_position_embeddings {positions} must be a perfect square (a learned side x side grid)"
        )


def build_config(
    full_size: bool = False, family: str = "qwen2_vl", added: dict[str, int] = QWEN2VL_SPECIAL_TOKENS, **overrides: Any
):
    """The family's config, tiny or at the real sizes, with the real vocab and the token ids of `added` (default: the
    real ones). Overrides: any text-config field, `vision_<field>` for the vision config, `rope_theta`,
    `mrope_section`, `tie_word_embeddings`, `dtype`; fields not set here keep transformers' defaults, which are the
    real checkpoints' values."""
    import transformers

    record, spec = _family(family), _SPECS[family]
    prefix = record.class_name.removesuffix("ForConditionalGeneration")
    config_class, text_class, vision_class = (
        getattr(transformers, prefix + kind) for kind in ("Config", "TextConfig", "VisionConfig")
    )
    settings = {**(spec.full if full_size else spec.tiny), **overrides}
    vision = {key[len("vision_") :]: settings.pop(key) for key in list(settings) if key.startswith("vision_")}
    tie_word_embeddings = bool(settings.pop("tie_word_embeddings"))
    dtype = str(settings.pop("dtype")).removeprefix("torch.")
    rope_theta = float(settings.pop("rope_theta"))
    head_dim = settings.get("head_dim") or settings["hidden_size"] // settings["num_attention_heads"]
    mrope_section = list(settings.pop("mrope_section", None) or _default_mrope_section(head_dim, family))
    if sum(mrope_section) != head_dim // 2:
        raise ValueError(f"mrope_section {mrope_section} must sum to head_dim/2 = {head_dim // 2}")
    unknown = set(settings) - _config_fields(text_class)
    unknown |= {f"vision_{key}" for key in set(vision) - _config_fields(vision_class)}
    if unknown:
        raise TypeError(f"unknown overrides {sorted(unknown)}")

    rope_parameters = {"rope_type": "default", "rope_theta": rope_theta, "mrope_section": mrope_section}
    pad = added["<|endoftext|>"]  # also the bos
    token_ids = {"bos_token_id": pad, "eos_token_id": added["<|im_end|>"], "pad_token_id": pad}
    if family == "qwen3_vl":
        rope_parameters["mrope_interleaved"] = True
        text_ids = {"pad_token_id": pad}
    else:  # no sliding window in any layer, as in the real config
        text_ids = {**token_ids, "max_window_layers": settings["num_hidden_layers"]}
    text_config = {
        "vocab_size": REAL_VOCAB_SIZE,
        **text_ids,
        "rope_parameters": rope_parameters,
        "dtype": dtype,
        **settings,
    }
    merger_width = "hidden_size" if family == "qwen2_vl" else "out_hidden_size"
    vision_config = {
        merger_width: text_config["hidden_size"],
        "patch_size": record.patch_size,
        "spatial_merge_size": record.merge_size,
        **vision,
    }
    _check_vision(vision_config)
    return config_class(
        text_config=text_config,
        vision_config=vision_config,
        tie_word_embeddings=tie_word_embeddings,
        image_token_id=added["<|image_pad|>"],
        video_token_id=added["<|video_pad|>"],
        vision_start_token_id=added["<|vision_start|>"],
        vision_end_token_id=added["<|vision_end|>"],
        architectures=[record.class_name],
        dtype=dtype,
        **(token_ids if family == "qwen2_vl" else {}),
    )


def initialize_weights(model, seed: int, std: float = INITIALIZER_RANGE) -> None:
    """Overwrite every parameter: norms 1, biases 0, the rest N(0, std) from a generator seeded by (seed, name), so a
    seed pins the weights whatever the construction order, dtype or transformers' init code."""
    import torch

    norms = {id(p) for module in model.modules() if "Norm" in type(module).__name__ for p in module.parameters(False)}
    to_draw = []
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # a tied tensor is listed once
            if id(parameter) in norms:
                parameter.fill_(0.0 if name.endswith(".bias") else 1.0)
            elif name.endswith(".bias"):
                parameter.zero_()
            else:
                to_draw.append((name, parameter))

    def draw(named_parameter) -> None:
        name, parameter = named_parameter
        # crc32 is stable across processes (unlike hash()); one generator per tensor, so threads cannot reorder draws
        seed_of_name = (seed * 1_000_003 + zlib.crc32(name.encode("utf-8"))) % (2**63 - 1)
        generator = torch.Generator(device="cpu").manual_seed(seed_of_name)
        with torch.no_grad():
            parameter.copy_(torch.empty(parameter.shape, dtype=torch.float32).normal_(0.0, std, generator=generator))

    to_draw.sort(key=lambda item: item[1].numel(), reverse=True)  # the embedding first, not last on its own
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(draw, to_draw))


def build_model(config, seed: int = 0, thinking: bool = True):
    """The family's `*ForConditionalGeneration` for `config` with seeded weights, in the config's dtype."""
    import torch
    from transformers.initialization import no_init_weights

    dtype = getattr(torch, str(config.dtype).removeprefix("torch.")) if config.dtype else torch.float32
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # allocate directly in the target dtype (halves peak memory for full size)
    try:
        with no_init_weights():  # every weight is drawn below: skip the init (half the full-size build)
            model = get_family(config.model_type).model_class()(config)
    finally:
        torch.set_default_dtype(previous_dtype)
    model.tie_weights()  # no_init_weights also skips the tying that init_weights does
    initialize_weights(model, seed=seed)
    model.generation_config = build_generation_config(config.model_type, thinking)
    return model.eval()


def build_generation_config(family: str = "qwen2_vl", thinking: bool = True):
    from transformers import GenerationConfig

    thinking_model = family == "qwen3_vl" and thinking
    return GenerationConfig(**(QWEN3_VL_GENERATION_CONFIG if thinking_model else REAL_GENERATION_CONFIG))


def small_vocab_model(family: str, seed: int, pixels: tuple[int, int], model_max_length: int, **overrides):
    """(model, processor): a random-init `family` model (`overrides`: `build_config`'s) over the small trained
    vocabulary (the trained BPE, the added tokens right after it: ~2.6k ids, the vocab size rounded up to a multiple
    of 64), every config and generation id pointing at the new ids; a model that samples (Qwen3-VL Thinking) never
    generates the embedding rows past the tokenizer."""
    vocab, merges = train_byte_level_bpe(DEFAULT_BPE_VOCAB_SIZE)
    ids = {token: len(vocab) + i for i, token in enumerate(ADDED_TOKENS[family])}
    tokenizer = qwen2_tokenizer(vocab, merges, ids, chat_template(family), model_max_length)
    vocab_size = 64 * math.ceil(len(tokenizer) / 64)
    config = build_config(family=family, added=ids, vocab_size=vocab_size, **overrides)
    model = build_model(config, seed=seed)  # the family's generation config (Thinking for Qwen3-VL), ids below
    bos = pad = ids["<|endoftext|>"]
    model.generation_config.update(bos_token_id=bos, pad_token_id=pad, eos_token_id=[ids["<|im_end|>"], bos])
    if family == "qwen3_vl":
        model.generation_config.suppress_tokens = list(range(len(tokenizer), vocab_size))
    return model, build_processor(tokenizer, min_pixels=pixels[0], max_pixels=pixels[1], family=family)


def unused_token_ids(tokenizer, vocab_size: int = REAL_VOCAB_SIZE) -> list[int]:
    """The ids no text encodes to: the placeholders, and the embedding rows past the tokenizer. A real model gives
    them ~no probability; a tiny random one does, so a stand-in policy that samples suppresses them (build_tiny's
    `suppress_unused`; run 15 in experiments/captioning/LOG.md)."""
    names = tokenizer.convert_ids_to_tokens(list(range(FIRST_SPECIAL_TOKEN_ID)))
    placeholders = [i for i, name in enumerate(names) if name == PLACEHOLDER_TOKEN_FORMAT.format(i)]
    return placeholders + list(range(len(tokenizer), vocab_size))


def build_tiny(
    family: str,
    out_dir: str | os.PathLike,
    full_size: bool = False,
    seed: int = 0,
    overwrite: bool = False,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    bpe_vocab_size: int = DEFAULT_BPE_VOCAB_SIZE,
    thinking: bool = True,
    suppress_unused: bool = False,
    **overrides: Any,
) -> Path:
    """Write a checkpoint dir of `family` (model, tokenizer, processor, generation config) and return its path.

    Written beside `out_dir` and renamed into place, so no reader sees it half-written. An existing `out_dir` is
    replaced only when this builder wrote it and nothing was trained into it, or with `overwrite=True`.
    `min_pixels` / `max_pixels`: the image processor's (None: the real one's); `thinking`: Qwen3-VL's Thinking
    template and generation config (else Instruct); `suppress_unused`: the generation config suppresses
    `unused_token_ids`, for a tiny model that samples in place of a real one; `overrides`: `build_config`'s.
    """
    _family(family)
    out_dir = Path(out_dir).resolve()
    check_target(out_dir, "--out", "a tiny model")  # not /, $HOME or the repo, and writable
    check_replaceable(out_dir, overwrite)
    thinking = bool(thinking)
    config = build_config(full_size=full_size, family=family, **overrides)

    tokenizer = build_tokenizer(int(bpe_vocab_size), family=family, thinking=thinking)
    processor = build_processor(tokenizer, min_pixels, max_pixels, family=family, thinking=thinking)
    model = build_model(config, seed=seed, thinking=thinking)
    if suppress_unused:  # HF generate and the graph decoder read it here, GRPO's rollouts too (open_r1.trainer)
        model.generation_config.suppress_tokens = unused_token_ids(tokenizer, config.get_text_config().vocab_size)

    with installing(out_dir) as staging:  # no reader sees it half-written; shared modes 0755/0644
        model.save_pretrained(staging)
        processor.save_pretrained(staging)
        marker = {
            "builder": "open_r1.tiny_models",
            "family": family,
            "full_size": full_size,
            "seed": seed,
            "thinking": thinking if family == "qwen3_vl" else None,
        }
        write_json(os.path.join(staging, BUILD_MARKER_FILE), marker)
    return out_dir


build_qwen2vl = functools.partial(build_tiny, "qwen2_vl")  # a checkpoint laid out like Qwen/Qwen2-VL-2B-Instruct


def check_replaceable(out_dir: Path, overwrite: bool = False) -> None:
    """Refuse to replace a dir this builder did not write, or one a run trained into, unless `overwrite`."""
    if not out_dir.exists() or overwrite:
        return
    if not out_dir.is_dir():
        raise ModelError(f"{out_dir} exists and is not a directory; pick another --out")
    entries = {path.name for path in out_dir.iterdir()}
    trained = sorted(name for name in entries if name in TRAINED_MARKERS or name.startswith("checkpoint-"))
    if not entries or (BUILD_MARKER_FILE in entries and not trained):
        return  # empty, or an earlier build of this tool: safe to rebuild
    what = (
        f"a trained model ({', '.join(trained[:3])})"
        if trained
        else ("a model" if "config.json" in entries else f"{len(entries)} files not written by this builder")
    )
    raise ModelError(
        f"{out_dir} already holds {what}; refusing to replace it. Pick another --out, or pass "
        "--overwrite (overwrite=True) to delete it and build there"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI: build one checkpoint; prints its path. Exit 0, or 2 with `error: ...` for a bad request."""
    setup_logging()
    parser = cli_parser("open-r1-tiny-model", __doc__.split("\n\n")[0])
    parser.add_argument("--family", default="qwen2_vl", choices=SUPPORTED, help="model family")
    parser.add_argument("--out", required=True, help="checkpoint directory to write (atomically)")
    parser.add_argument("--full-size", action="store_true", help="the real model's dimensions, random bf16 weights")
    parser.add_argument("--seed", type=int, default=0, help="weights are a pure function of the seed")
    parser.add_argument("--min-pixels", type=int, help="image processor min_pixels (the real one's)")
    parser.add_argument("--max-pixels", type=int, help="image processor max_pixels (the real one's)")
    parser.add_argument(
        "--instruct",
        action="store_true",
        help="qwen3_vl: the Instruct chat template (default: Thinking, prompt ends with <think>)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out even if it holds a trained model or files this tool did not write",
    )
    parser.add_argument(
        "--suppress-unused",
        action="store_true",
        help="generation never samples the ids no text encodes to (a sampling stand-in policy)",
    )
    args = parser.parse_args(argv)
    try:
        out_dir = build_tiny(
            args.family,
            args.out,
            full_size=args.full_size,
            seed=args.seed,
            overwrite=args.overwrite,
            thinking=not args.instruct,
            suppress_unused=args.suppress_unused,
            min_pixels=args.min_pixels or None,  # 0: the real one's, as leaving it out
            max_pixels=args.max_pixels or None,
        )
    except (OpenR1Error, ValueError, TypeError) as exc:
        return error_exit(exc)
    print(out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
