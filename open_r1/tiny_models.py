"""A Qwen2-VL checkpoint the project builds itself, laid out exactly like `Qwen/Qwen2-VL-2B-Instruct`.

Why: the real weights cannot be downloaded here (no model hub), yet the training, evaluation and export code must be
exercised end to end on the real loading path (`AutoProcessor.from_pretrained`,
`Qwen2VLForConditionalGeneration.from_pretrained`). So this module writes a directory with the same files, classes,
special-token ids, chat template, image-processor settings and generation config as the real checkpoint, and only
the sizes differ:

* tiny (default): a ~10M-parameter model (almost all of it the 151936-row embedding, kept at the real vocab size so
  token ids mean the same as in the real model) that builds in seconds on CPU, for tests;
* `full_size=True`: the real 2B dimensions (~2.2B parameters) with random bf16 weights, for GPU benchmarks that
  need the real compute and memory profile but not the real answers.

The tokenizer is a byte-level BPE trained here (Qwen2's normaliser, pre-tokenizer regex and decoder) on a small
embedded corpus covering the counting prompts, digits, `<think>`/`<answer>` and simple English. To give the 14
Qwen2-VL special tokens their real ids (151643..151656) the BPE vocabulary is padded up to id 151642 with
placeholder tokens that no text can produce, so `len(tokenizer)` is 151657 exactly as for the real tokenizer.

Weights are drawn per parameter from a generator seeded by (seed, parameter name), so the same seed gives the same
state dict independently of construction order or transformers' own init code.

Only APIs present in transformers 5.17 are used (the GPU machine's version).
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import tempfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Ids and strings of the real Qwen2-VL added tokens, in id order. The tokenizer, the model config and the
# processor all rely on these exact ids.
QWEN2VL_SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647,
    "<|box_start|>": 151648,
    "<|box_end|>": 151649,
    "<|quad_start|>": 151650,
    "<|quad_end|>": 151651,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}
FIRST_SPECIAL_TOKEN_ID = 151643  # = size of the real BPE vocabulary
REAL_VOCAB_SIZE = 151936  # embedding rows of the real model (padded past len(tokenizer) == 151657)
PLACEHOLDER_TOKEN_FORMAT = "<|reserved_{}|>"  # fills BPE ids nothing encodes to, up to FIRST_SPECIAL_TOKEN_ID

BOS_TOKEN_ID = QWEN2VL_SPECIAL_TOKENS["<|endoftext|>"]
EOS_TOKEN_ID = QWEN2VL_SPECIAL_TOKENS["<|im_end|>"]
PAD_TOKEN_ID = QWEN2VL_SPECIAL_TOKENS["<|endoftext|>"]

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
# The chat template shipped with Qwen/Qwen2-VL-2B-Instruct, verbatim.
QWEN2VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)

# The real preprocessor_config.json values (min/max pixels = 4 / 16384 merged patches of 28x28).
REAL_MIN_PIXELS = 56 * 56  # 3136
REAL_MAX_PIXELS = 28 * 28 * 16384  # 12845056
OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# The real generation_config.json (effectively greedy: top_k=1). TRL's GRPOTrainer overrides these with its own
# sampling settings, as it must for the real model too.
REAL_GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": BOS_TOKEN_ID,
    "pad_token_id": PAD_TOKEN_ID,
    "eos_token_id": [EOS_TOKEN_ID, BOS_TOKEN_ID],
    "do_sample": True,
    "repetition_penalty": 1.0,
    "temperature": 0.01,
    "top_p": 0.001,
    "top_k": 1,
}

# Text decoder + vision tower sizes. `vision_hidden_size` is the merger's output width and must equal the text
# `hidden_size`; when left out it follows it. `mrope_section` splits head_dim/2 rotary frequencies into
# (temporal, height, width); when left out it is derived in the real 1:1.5:1.5 ratio.
TINY_MODEL_DEFAULTS: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "vision_depth": 2,
    "vision_embed_dim": 32,
    "vision_num_heads": 4,
    "vision_mlp_ratio": 4,
    "tie_word_embeddings": True,
    "dtype": "float32",  # CPU tests; fp32 avoids bf16 CPU kernels being slow or missing
}
FULL_SIZE_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1536,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "intermediate_size": 8960,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "vision_depth": 32,
    "vision_embed_dim": 1280,
    "vision_num_heads": 16,
    "vision_mlp_ratio": 4,
    "tie_word_embeddings": True,
    "dtype": "bfloat16",  # the real checkpoint's dtype
}
# Overrides that are not model-config fields.
PROCESSOR_OVERRIDE_KEYS = ("min_pixels", "max_pixels")
BUILD_OVERRIDE_KEYS = ("bpe_vocab_size",)
DEFAULT_BPE_VOCAB_SIZE = 4096  # upper bound; the small corpus runs out of merges first (~2.5k tokens)
INITIALIZER_RANGE = 0.02

# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------------

_COUNTING_QUESTIONS = [
    "How many items are there in the image?",
    "How many objects are there in the image?",
    "How many {plural} are there in the image?",
    "How many {plural} are in the picture?",
    "How many {color} {plural} are there?",
    "Count the {plural} in the image.",
    "What is the number of {plural}?",
    "Subtract all {color} {plural}. How many objects are left?",
]
_PROMPT_SUFFIXES = [
    " First output the thinking process in <think> </think> and final answer (number) in <answer> </answer> tags.",
    "  Output the thinking process in <think> </think> and final answer (number) in <answer> </answer> tags.",
]
_OBJECTS = [
    ("item", "items"), ("object", "objects"), ("cube", "cubes"), ("sphere", "spheres"), ("ball", "balls"),
    ("cylinder", "cylinders"), ("block", "blocks"), ("apple", "apples"), ("car", "cars"), ("bus", "buses"),
    ("bicycle", "bicycles"), ("motorbike", "motorbikes"), ("airplane", "airplanes"), ("person", "people"),
    ("dog", "dogs"), ("cat", "cats"), ("bird", "birds"), ("cup", "cups"), ("chair", "chairs"), ("book", "books"),
    ("tree", "trees"), ("flower", "flowers"), ("box", "boxes"), ("shape", "shapes"), ("circle", "circles"),
    ("square", "squares"), ("triangle", "triangles"), ("star", "stars"), ("coin", "coins"), ("bottle", "bottles"),
]
_COLORS = ["red", "blue", "green", "yellow", "purple", "cyan", "brown", "gray", "black", "white", "orange", "pink"]
_MATERIALS = ["rubber", "metal", "shiny", "matte", "large", "small", "big", "tiny"]
# Common English words, so everyday text gets word-level tokens rather than single bytes.
_COMMON_WORDS = """
a about above across act add after again against age ago agree air all almost alone along already also always am
among and animal another answer any appear are area arm around arrive art as ask at away baby back bad bag ball bank
base be bear beat beautiful because become bed been before begin behind believe below best better between big bird
bit black blood blue board boat body bone book both bottom box boy bread break bright bring broad brother brown build
burn busy but buy by call came camp can capital car card care carry case cat catch cause cell center certain chair
chance change character charge check chief child children choose church circle city class clean clear climb clock
close cloth cloud coast cold collect color column come common company compare complete condition consider contain
continue control cook cool copy corn corner correct cost cotton could count country course cover cow create cross
crowd cry current cut dad dance dark day dead deal dear decide deep degree depend describe desert design determine
develop dictionary did die difference different difficult direct discuss distant divide do doctor does dog dollar
done door double down draw dream dress drink drive drop dry during each ear early earth ease east eat edge effect egg
eight either electric element else end enemy energy engine enough enter equal even evening event ever every exact
example except excite exercise expect experience experiment explain eye face fact fair fall family famous far farm
fast father fear feed feel feet fell few field fig fight figure fill final find fine finger finish fire first fish
fit five flat floor flow flower fly follow food foot for force forest form forward found four free fresh friend from
front fruit full fun game garden gas gather gave general gentle get girl give glad glass go gold good got govern
grand grass gray great green ground group grow guess guide gun had hair half hand happen happy hard has hat have he
head hear heard heart heat heavy held help her here high hill him his history hit hold hole home hope horse hot hour
house how huge human hundred hunt hurry ice idea if imagine in inch include indicate industry insect instant
instrument interest invent iron is island it job join joy jump just keep kept key kill kind king knew know lady lake
land language large last late laugh law lay lead learn least leave led left leg length less let letter level lie
life lift light like line liquid list listen little live locate log lone long look lost lot loud love low machine
made magnet main major make man many map mark market mass master match material matter may me mean measure meat meet
melody men metal method middle might mile milk million mind mine minute miss modern molecule moment money month moon
more morning most mother motion mount mountain mouth move much multiply music must my name nation natural nature near
necessary neck need neighbor never new next night nine no noise noon nor north nose note nothing notice noun now
number numeral object observe occur ocean of off offer office often oh oil old on once one only open operate opposite
or order organ original other our out over own oxygen page paint pair paper paragraph parent part particular party
pass past path pattern pay people perhaps period person picture piece pitch place plain plan plane planet plant play
please plural poem point poor populate port pose position possible post pound power practice prepare present press
pretty print probable problem process produce product proper property protect prove provide pull push put quart
question quick quiet quite quotient race radio rail rain raise ran range rather reach read ready real reason receive
record region remember repeat reply represent require rest result rich ride right ring rise river road rock roll room
root rope rose round row rub rule run safe said sail salt same sand sat save saw say scale school science score sea
search season seat second section see seed seem segment select self sell send sense sentence separate serve set
settle seven several shall shape share sharp she sheet shell shine ship shoe shop shore short should shoulder shout
show side sight sign silent silver similar simple since sing single sister sit six size skill skin sky sleep slip
slow small smell smile snow so soft soil soldier solution solve some son song soon sound south space speak special
speech speed spell spend spoke spot spread spring square stand star start state station stay stead steam steel step
stick still stone stood stop store story straight strange stream street stretch string strong student study subject
substance success such sudden suffix sugar suggest suit summer sun supply support sure surface surprise swim syllable
symbol system table tail take talk tall teach team teeth tell temperature ten term test than thank that the their
them then there these they thick thin thing think third this those though thought thousand three through throw thus
tie time tiny tire to together told tone too took tool top total touch toward town track trade train travel tree
triangle trip trouble truck true try tube turn twenty two type under unit until up us use usual valley value vary
verb very view village visit voice vowel wait walk wall want war warm was wash watch water wave way we wear weather
week weight well went were west what wheel when where whether which while white who whole whose why wide wife wild
will win wind window wing winter wire wish with woman women wonder wood word work world would write written wrong
wrote yard year yellow yes yet you young your
""".split()
_SIMPLE_ENGLISH = """
I see a picture with some things in it. Let me look at the image and count them one by one.
There is one red cube, two blue spheres and three green cylinders, so the total is six.
First, I find every object. Then I count each one carefully and add the numbers together.
The answer is the number of objects I counted. I think the answer is correct.
We can see the left side and the right side of the image. On the left there are four balls; on the right, five.
Four plus five equals nine. Nine minus two equals seven. Ten is more than eight, and three is less than seven.
Zero, one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen, fourteen, fifteen,
sixteen, seventeen, eighteen, nineteen, twenty. First, second, third, last. Each, every, all, none, some, many, few.
The model should think step by step. It should output the thinking process and then give the final answer.
Hello! How are you? I am fine, thank you. What is this? This is a small metal cube next to a large rubber ball.
Where is the cat? The cat is under the table, behind the chair, near the door, in front of the house.
Yes, no, maybe. Please answer the question. The question asks how many there are. Because of that, I counted again.
It is a sunny day. The children play in the park with a dog. People walk on the street and cars drive by.
Look, count, add, subtract, compare, check, answer, think, see, find, know, say, make, take, give, use, try.
<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
Picture 1: <|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|>
<|im_start|>assistant
The image shows a few objects on a table.<|im_end|>
""".split("\n")


def tokenizer_training_corpus() -> list[str]:
    """The embedded text the BPE is trained on: counting prompts in both wordings, answers, numbers, simple English."""
    lines: list[str] = [line.strip() for line in _SIMPLE_ENGLISH if line.strip()]
    # Each common word in lower case and capitalised, mid-sentence (with a leading space) as BPE sees most words.
    for start in range(0, len(_COMMON_WORDS), 12):
        chunk = _COMMON_WORDS[start : start + 12]
        lines.append(" ".join(chunk) + ".")
        lines.append(" ".join(word.capitalize() for word in chunk) + "?")
    for index, (singular, plural) in enumerate(_OBJECTS):
        color = _COLORS[index % len(_COLORS)]
        material = _MATERIALS[index % len(_MATERIALS)]
        for question in _COUNTING_QUESTIONS:
            question = question.format(plural=plural, color=color)
            for suffix in _PROMPT_SUFFIXES:
                lines.append(question + suffix)
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


def _train_byte_level_bpe(vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a byte-level BPE with Qwen2's normaliser and pre-tokenizer; return its vocab and merges."""
    from tokenizers import (
        Regex,
        Tokenizer,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodes, as in Qwen2
        special_tokens=[],  # special tokens are added after the placeholders, at their real ids
        show_progress=False,
    )
    bpe.train_from_iterator(tokenizer_training_corpus(), trainer)
    model_json = json.loads(bpe.to_str())["model"]
    merges = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in model_json["merges"]]
    return dict(model_json["vocab"]), merges


def build_tokenizer(bpe_vocab_size: int = DEFAULT_BPE_VOCAB_SIZE):
    """A `Qwen2Tokenizer` (the class the real tokenizer_config names): a small trained BPE, the real special ids."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = _train_byte_level_bpe(bpe_vocab_size)
    trained_size = len(vocab)
    if trained_size >= FIRST_SPECIAL_TOKEN_ID:
        raise ValueError(f"trained BPE has {trained_size} tokens; it must stay below {FIRST_SPECIAL_TOKEN_ID}")
    # Placeholders are in the BPE vocab but no merge produces them, so no text ever encodes to them.
    for token_id in range(trained_size, FIRST_SPECIAL_TOKEN_ID):
        vocab[PLACEHOLDER_TOKEN_FORMAT.format(token_id)] = token_id
    if len(vocab) != FIRST_SPECIAL_TOKEN_ID:
        raise AssertionError("placeholder names collided with trained tokens")

    special_tokens = list(QWEN2VL_SPECIAL_TOKENS)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        # Passing the ids makes them added in id order, right after the padded vocab: exactly the real ids.
        added_tokens_decoder={
            token_id: AddedToken(token, special=True, normalized=False, lstrip=False, rstrip=False)
            for token, token_id in QWEN2VL_SPECIAL_TOKENS.items()
        },
        extra_special_tokens=special_tokens[1:],  # the real `additional_special_tokens`
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        errors="replace",
        split_special_tokens=False,
        chat_template=QWEN2VL_CHAT_TEMPLATE,
    )
    _check_special_token_ids(tokenizer)
    return tokenizer


def _check_special_token_ids(tokenizer) -> None:
    wrong = {
        token: tokenizer.convert_tokens_to_ids(token)
        for token, token_id in QWEN2VL_SPECIAL_TOKENS.items()
        if tokenizer.convert_tokens_to_ids(token) != token_id
    }
    if wrong:
        raise AssertionError(f"special tokens got the wrong ids: {wrong}")


# ---------------------------------------------------------------------------------------------------------------------
# Processor
# ---------------------------------------------------------------------------------------------------------------------


def build_processor(tokenizer=None, min_pixels: int = REAL_MIN_PIXELS, max_pixels: int = REAL_MAX_PIXELS):
    """`Qwen2VLProcessor` = the tokenizer + the real image-processor settings (pixel budget overridable)."""
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    if tokenizer is None:
        tokenizer = build_tokenizer()
    # A fresh `size` dict rather than min_pixels=/max_pixels=: in 5.17 those kwargs write into the class-level
    # default dict, leaking into every later Qwen2VLImageProcessor in the process.
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": int(min_pixels), "longest_edge": int(max_pixels)},
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=list(OPENAI_CLIP_MEAN),
        image_std=list(OPENAI_CLIP_STD),
    )
    video_processor = Qwen2VLVideoProcessor()
    return Qwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=QWEN2VL_CHAT_TEMPLATE,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Model config and weights
# ---------------------------------------------------------------------------------------------------------------------


def _default_mrope_section(head_dim: int) -> list[int]:
    """Split head_dim/2 rotary frequencies into (temporal, height, width) as the real model does (16, 24, 24 of 64)."""
    half = head_dim // 2
    temporal = half // 4
    height = (half - temporal) // 2
    return [temporal, height, half - temporal - height]


def _config_fields(config_class) -> set[str]:
    # Configs accept unknown kwargs silently; checking names catches a typo'd override.
    return set(inspect.signature(config_class.__init__).parameters) - {"self", "kwargs"}


def build_config(full_size: bool = False, **overrides: Any):
    """The `Qwen2VLConfig`: tiny or the real 2B sizes, with the real vocab and special-token ids.

    Overrides: any text-config field (`hidden_size`, `num_hidden_layers`, ...), `rope_theta`, `mrope_section`,
    `vision_<field>` for the vision config (`vision_depth`, `vision_embed_dim`, ...), `tie_word_embeddings`, `dtype`.
    """
    from transformers import Qwen2VLConfig, Qwen2VLTextConfig, Qwen2VLVisionConfig

    settings = dict(FULL_SIZE_DEFAULTS if full_size else TINY_MODEL_DEFAULTS)
    settings.update(overrides)
    vision = {key[len("vision_"):]: settings.pop(key) for key in list(settings) if key.startswith("vision_")}
    tie_word_embeddings = bool(settings.pop("tie_word_embeddings"))
    dtype = str(settings.pop("dtype")).removeprefix("torch.")
    rope_theta = float(settings.pop("rope_theta"))
    head_dim = settings["hidden_size"] // settings["num_attention_heads"]
    mrope_section = list(settings.pop("mrope_section", None) or _default_mrope_section(head_dim))
    if sum(mrope_section) != head_dim // 2:
        raise ValueError(f"mrope_section {mrope_section} must sum to head_dim/2 = {head_dim // 2}")

    unknown = set(settings) - _config_fields(Qwen2VLTextConfig)
    unknown |= {f"vision_{key}" for key in set(vision) - _config_fields(Qwen2VLVisionConfig)}
    if unknown:
        raise TypeError(f"unknown overrides {sorted(unknown)}")
    text_config = {
        "vocab_size": REAL_VOCAB_SIZE,
        "hidden_act": "silu",
        "initializer_range": INITIALIZER_RANGE,
        "use_sliding_window": False,
        "max_window_layers": settings["num_hidden_layers"],
        "attention_dropout": 0.0,
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta, "mrope_section": mrope_section},
        "dtype": dtype,
        **settings,
    }
    vision_config = {
        "depth": 32,
        "embed_dim": 1280,
        "hidden_size": text_config["hidden_size"],  # merger output feeds the text embeddings
        "hidden_act": "quick_gelu",
        "mlp_ratio": 4,
        "num_heads": 16,
        "in_channels": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "initializer_range": INITIALIZER_RANGE,
        **vision,
    }
    config = Qwen2VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=QWEN2VL_SPECIAL_TOKENS["<|image_pad|>"],
        video_token_id=QWEN2VL_SPECIAL_TOKENS["<|video_pad|>"],
        vision_start_token_id=QWEN2VL_SPECIAL_TOKENS["<|vision_start|>"],
        vision_end_token_id=QWEN2VL_SPECIAL_TOKENS["<|vision_end|>"],
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
        architectures=["Qwen2VLForConditionalGeneration"],
        dtype=dtype,
    )
    return config


def count_parameters(config) -> int:
    """Parameter count of a config without allocating weights (built on the meta device); tied weights count once."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2VLForConditionalGeneration(config)
    return sum(parameter.numel() for parameter in model.parameters())


def _parameter_seed(seed: int, name: str) -> int:
    # crc32 is stable across processes (unlike hash()), so the seed depends only on (seed, name).
    return (seed * 1_000_003 + zlib.crc32(name.encode("utf-8"))) % (2**63 - 1)


def initialize_weights(model, seed: int, std: float = INITIALIZER_RANGE) -> None:
    """Overwrite every parameter from a per-parameter seeded generator: norms 1, biases 0, the rest N(0, std).

    Independent of module construction order, dtype and transformers' init code, so a seed pins the weights (bf16
    weights are the fp32 draws rounded). Tensors are drawn in parallel threads; each has its own generator, so the
    result does not depend on scheduling.
    """
    import torch

    norm_parameters = {
        id(parameter)
        for module in model.modules()
        if "Norm" in type(module).__name__  # nn.LayerNorm and Qwen2VLRMSNorm
        for parameter in module.parameters(recurse=False)
    }
    to_draw = []
    with torch.no_grad():
        # named_parameters() lists a tied tensor once (under its first name), so nothing is drawn twice.
        for name, parameter in model.named_parameters():
            if id(parameter) in norm_parameters:
                parameter.fill_(0.0 if name.endswith(".bias") else 1.0)
            elif name.endswith(".bias"):
                parameter.zero_()
            else:
                to_draw.append((name, parameter))

    def draw(named_parameter) -> None:
        name, parameter = named_parameter
        generator = torch.Generator(device="cpu").manual_seed(_parameter_seed(seed, name))
        values = torch.empty(parameter.shape, dtype=torch.float32).normal_(0.0, std, generator=generator)
        with torch.no_grad():
            parameter.copy_(values)

    # Largest first, so the embedding does not start last and leave the other threads idle.
    to_draw.sort(key=lambda item: item[1].numel(), reverse=True)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(draw, to_draw))


def build_model(config, seed: int = 0):
    """A `Qwen2VLForConditionalGeneration` for `config` with seeded weights, in the config's dtype."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration
    from transformers.initialization import no_init_weights

    dtype = getattr(torch, str(config.dtype).removeprefix("torch.")) if config.dtype else torch.float32
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # allocate directly in the target dtype (halves peak memory for full size)
    try:
        # Every weight is overwritten below, so skip torch's and transformers' own init (half the full-size build).
        with no_init_weights():
            model = Qwen2VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous_dtype)
    model.tie_weights()  # no_init_weights also skips the tying that init_weights does
    initialize_weights(model, seed=seed, std=config.text_config.initializer_range)
    model.generation_config = build_generation_config()
    return model.eval()


def build_generation_config():
    from transformers import GenerationConfig

    return GenerationConfig(**REAL_GENERATION_CONFIG)


# ---------------------------------------------------------------------------------------------------------------------
# The whole checkpoint
# ---------------------------------------------------------------------------------------------------------------------


def build_qwen2vl(out_dir: str | os.PathLike, full_size: bool = False, seed: int = 0, **overrides: Any) -> Path:
    """Write a Qwen2-VL checkpoint directory (model, tokenizer, processor, generation config); return its path.

    Loadable with `AutoProcessor.from_pretrained(out_dir)` and `Qwen2VLForConditionalGeneration.from_pretrained(
    out_dir)` like `Qwen/Qwen2-VL-2B-Instruct`. Written to a temporary sibling directory then renamed into place,
    so a reader never sees a half-written checkpoint; an existing `out_dir` is replaced.

    Overrides: `min_pixels` / `max_pixels` (image processor), `bpe_vocab_size` (tokenizer), and any model-config
    override accepted by `build_config`.
    """
    out_dir = Path(out_dir).resolve()
    processor_overrides = {key: overrides.pop(key) for key in PROCESSOR_OVERRIDE_KEYS if key in overrides}
    bpe_vocab_size = int(overrides.pop("bpe_vocab_size", DEFAULT_BPE_VOCAB_SIZE))
    config = build_config(full_size=full_size, **overrides)

    processor = build_processor(build_tokenizer(bpe_vocab_size), **processor_overrides)
    model = build_model(config, seed=seed)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        model.save_pretrained(staging_dir)
        processor.save_pretrained(staging_dir)
        # mkdtemp (and transformers' own temp files) are private to the owner; a checkpoint is meant to be shared.
        for path in [staging_dir, *staging_dir.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        _swap_into_place(staging_dir, out_dir)
    except BaseException:
        shutil.rmtree(staging_dir, ignore_errors=True)
        raise
    return out_dir


def _swap_into_place(staging_dir: Path, out_dir: Path) -> None:
    """Rename `staging_dir` to `out_dir`, moving any previous `out_dir` aside first and deleting it afterwards."""
    previous_dir = None
    if out_dir.exists():
        previous_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.rename(out_dir, previous_dir / out_dir.name)
    os.rename(staging_dir, out_dir)
    if previous_dir is not None:
        shutil.rmtree(previous_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="checkpoint directory to write (replaced if it exists)")
    parser.add_argument("--full-size", action="store_true", help="real 2B dimensions, random bf16 weights")
    parser.add_argument("--seed", type=int, default=0, help="weights are a pure function of the seed")
    parser.add_argument("--min-pixels", type=int, default=None, help=f"image processor min_pixels ({REAL_MIN_PIXELS})")
    parser.add_argument("--max-pixels", type=int, default=None, help=f"image processor max_pixels ({REAL_MAX_PIXELS})")
    args = parser.parse_args(argv)
    overrides = {
        key: value for key, value in (("min_pixels", args.min_pixels), ("max_pixels", args.max_pixels)) if value
    }
    out_dir = build_qwen2vl(args.out, full_size=args.full_size, seed=args.seed, **overrides)
    print(out_dir)
    return out_dir
