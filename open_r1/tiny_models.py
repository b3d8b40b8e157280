"""Qwen-VL checkpoints the project builds itself, laid out exactly like the real ones, one builder per family.

Why: the real weights cannot be downloaded here (no model hub), yet the training, evaluation and export code must be
exercised end to end on the real loading path (`AutoProcessor.from_pretrained`,
`AutoModelForImageTextToText.from_pretrained`). So this module writes a directory with the same files, classes,
special-token ids, chat template, image-processor settings and generation config as the real checkpoint of a family
(`open_r1.families`), and only the sizes differ:

* `qwen2_vl`   like `Qwen/Qwen2-VL-2B-Instruct`;
* `qwen2_5_vl` like `Qwen/Qwen2.5-VL-3B-Instruct` (SwiGLU ViT with window attention, 22 added tokens);
* `qwen3_vl`   like `Qwen/Qwen3-VL-2B-Thinking` (16 px patches, deepstack, interleaved M-RoPE, 26 added tokens
  with `<think>` 151667 / `</think>` 151668, a generation prompt that opens the think block); `thinking=False`
  gives the Instruct template.

* tiny (default): a ~10M-parameter model (almost all of it the 151936-row embedding, kept at the real vocab size so
  token ids mean the same as in the real model) that builds in seconds on CPU, for tests;
* `full_size=True`: the real dimensions (Qwen2-VL-2B, Qwen2.5-VL-3B, Qwen3-VL-2B) with random bf16 weights, for
  GPU benchmarks that need the real compute and memory profile but not the real answers.

The tokenizer is a byte-level BPE trained here (Qwen2's normaliser, pre-tokenizer regex and decoder) on a small
embedded corpus covering the counting prompts, digits, `<think>`/`<answer>` and simple English. To give the added
tokens their real ids (151643 on) the BPE vocabulary is padded up to id 151642 with placeholder tokens that no text
can produce, so `len(tokenizer)` is the real one (151657 / 151665 / 151669).

Weights are drawn per parameter from a generator seeded by (seed, parameter name), so the same seed gives the same
state dict independently of construction order or transformers' own init code.

    python -m open_r1.tiny_models --family qwen3_vl --out models/tiny-qwen3vl      # or scripts/make_tiny_model.py
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

from open_r1.errors import CliHelp, ModelError, OpenR1Error
from open_r1.families import SUPPORTED, get_family


def _ids(first: int, names: str) -> dict[str, int]:
    return {name: first + i for i, name in enumerate(names.split())}


# Ids and strings of the real Qwen2-VL added tokens, in id order. The tokenizer, the model config and the
# processor all rely on these exact ids.
QWEN2VL_SPECIAL_TOKENS: dict[str, int] = _ids(151643, """<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|>
    <|object_ref_end|> <|box_start|> <|box_end|> <|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|>
    <|vision_pad|> <|image_pad|> <|video_pad|>""")
# Qwen2.5 tokenizers add tool-call and fill-in-the-middle tokens after the vision ones; Qwen3 adds tool responses and
# the think tags. In the real tokenizers these later ones are added but not "special" (decode keeps them).
QWEN2_5_VL_ADDED_TOKENS: dict[str, int] = {**QWEN2VL_SPECIAL_TOKENS, **_ids(151657, """<tool_call> </tool_call>
    <|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> <|file_sep|>""")}
QWEN3_VL_ADDED_TOKENS: dict[str, int] = {**QWEN2_5_VL_ADDED_TOKENS,
                                         **_ids(151665, "<tool_response> </tool_response> <think> </think>")}
ADDED_TOKENS: dict[str, dict[str, int]] = {
    "qwen2_vl": QWEN2VL_SPECIAL_TOKENS,
    "qwen2_5_vl": QWEN2_5_VL_ADDED_TOKENS,
    "qwen3_vl": QWEN3_VL_ADDED_TOKENS,
}
SPECIAL_TOKENS = set(QWEN2VL_SPECIAL_TOKENS)  # the rest are added tokens with special=False, as in the real files
FIRST_SPECIAL_TOKEN_ID = 151643  # = size of the real BPE vocabulary
REAL_VOCAB_SIZE = 151936  # embedding rows of the real model (padded past len(tokenizer) == 151657)
PLACEHOLDER_TOKEN_FORMAT = "<|reserved_{}|>"  # fills BPE ids nothing encodes to, up to FIRST_SPECIAL_TOKEN_ID

BOS_TOKEN_ID = QWEN2VL_SPECIAL_TOKENS["<|endoftext|>"]
EOS_TOKEN_ID = QWEN2VL_SPECIAL_TOKENS["<|im_end|>"]
PAD_TOKEN_ID = QWEN2VL_SPECIAL_TOKENS["<|endoftext|>"]

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

# Qwen2.5-VL-Instruct ships the same chat template as Qwen2-VL-Instruct.
QWEN2_5_VL_CHAT_TEMPLATE = QWEN2VL_CHAT_TEMPLATE


def _qwen3_vl_chat_template(thinking: bool) -> str:
    """The Qwen3-VL chat template, reduced to what a VLM prompt uses (no tool calls): no default system prompt,
    image/video placeholders as in Qwen2-VL, earlier assistant turns without their think block (Thinking: the turn
    after the last user turn keeps it, rendered `<think>\n{reasoning}\n</think>\n\n{answer}` as the real template
    does, so prompt + completion starts with the generation prompt and SFT trains the reasoning), and the generation
    prompt `<|im_start|>assistant\n` (Instruct) or `<|im_start|>assistant\n<think>\n` (Thinking: the model writes its
    reasoning first and closes it with `</think>`)."""
    generation_prompt = "<|im_start|>assistant\n<think>\n" if thinking else "<|im_start|>assistant\n"
    return (
        "{%- set image_count = namespace(value=0) -%}{%- set video_count = namespace(value=0) -%}"
        "{%- macro render_content(content, do_vision_count) -%}{%- if content is string -%}{{- content -}}"
        "{%- else -%}{%- for item in content -%}"
        "{%- if item['type'] == 'image' or 'image' in item or 'image_url' in item -%}"
        "{%- if do_vision_count -%}{%- set image_count.value = image_count.value + 1 -%}{%- endif -%}"
        "{%- if add_vision_id -%}Picture {{ image_count.value }}: {% endif -%}"
        "<|vision_start|><|image_pad|><|vision_end|>"
        "{%- elif item['type'] == 'video' or 'video' in item -%}"
        "{%- if do_vision_count -%}{%- set video_count.value = video_count.value + 1 -%}{%- endif -%}"
        "{%- if add_vision_id -%}Video {{ video_count.value }}: {% endif -%}"
        "<|vision_start|><|video_pad|><|vision_end|>"
        "{%- elif 'text' in item -%}{{- item['text'] -}}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}"
        "{%- set ns = namespace(last_query_index=messages|length - 1) -%}"
        "{%- for message in messages -%}{%- if message['role'] == 'user' -%}{%- set ns.last_query_index = loop.index0 -%}"
        "{%- endif -%}{%- endfor -%}"
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'assistant' -%}"
        "{%- set content = render_content(message['content'], false) -%}"
        "{%- set reasoning = '' -%}"
        "{%- if '</think>' in content -%}"
        "{%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}"
        "{%- set content = content.split('</think>')[-1].lstrip('\n') -%}{%- endif -%}"
        + (  # Thinking: the answer turn after the last user turn keeps its think block, as the real template does
            "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) -%}"
            "{{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n')"
            " + '<|im_end|>\n' -}}{%- else -%}{{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' -}}{%- endif -%}"
            if thinking else "{{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' -}}"
        )
        + "{%- else -%}"
        "{{- '<|im_start|>' + message['role'] + '\n' + render_content(message['content'], true) + '<|im_end|>\n' -}}"
        "{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '" + generation_prompt.replace("\n", "\\n") + "' -}}{%- endif -%}"
    )


QWEN3_VL_THINKING_CHAT_TEMPLATE = _qwen3_vl_chat_template(thinking=True)
QWEN3_VL_INSTRUCT_CHAT_TEMPLATE = _qwen3_vl_chat_template(thinking=False)


def chat_template(family: str, thinking: bool = True) -> str:
    if family == "qwen3_vl":
        return QWEN3_VL_THINKING_CHAT_TEMPLATE if thinking else QWEN3_VL_INSTRUCT_CHAT_TEMPLATE
    return QWEN2_5_VL_CHAT_TEMPLATE if family == "qwen2_5_vl" else QWEN2VL_CHAT_TEMPLATE


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
# Qwen2.5-VL and Qwen3-VL. Full sizes are the public config.json values of Qwen/Qwen2.5-VL-3B-Instruct and
# Qwen/Qwen3-VL-2B-{Instruct,Thinking} on the Hugging Face hub (as published; not downloadable here, written down
# from the model cards' config files). Vision keys use these families' field names (hidden_size / intermediate_size;
# the merger's out_hidden_size always follows the text hidden_size).
QWEN2_5_VL_TINY_DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in TINY_MODEL_DEFAULTS.items() if not k.startswith("vision_")},
    "vision_depth": 2,
    "vision_hidden_size": 32,
    "vision_intermediate_size": 64,
    "vision_num_heads": 4,
    "vision_window_size": 56,  # 2 merged tokens of 28 px per window side: tiny images still see several windows
    "vision_fullatt_block_indexes": [1],
}
QWEN2_5_VL_FULL_SIZE_DEFAULTS: dict[str, Any] = {  # Qwen/Qwen2.5-VL-3B-Instruct
    "hidden_size": 2048,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "intermediate_size": 11008,
    "max_position_embeddings": 128000,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "vision_depth": 32,
    "vision_hidden_size": 1280,
    "vision_intermediate_size": 3420,
    "vision_num_heads": 16,
    "vision_window_size": 112,
    "vision_fullatt_block_indexes": [7, 15, 23, 31],
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}
QWEN3_VL_TINY_DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in TINY_MODEL_DEFAULTS.items() if not k.startswith("vision_")},
    "head_dim": 16,
    "rope_theta": 5_000_000.0,
    "vision_depth": 2,
    "vision_hidden_size": 32,
    "vision_intermediate_size": 64,
    "vision_num_heads": 4,
    "vision_num_position_embeddings": 64,  # an 8x8 learned grid, resampled to each image (real: 48x48)
    # Deepstack feature k is added to the output of decoder layer k; with 2 decoder layers a second one would only
    # reach the last layer's image positions (no gradient from the answer), so the tiny model has one, as the real
    # 28-layer model has 3 ([5, 11, 17]) well before its last layer.
    "vision_deepstack_visual_indexes": [0],
}
QWEN3_VL_FULL_SIZE_DEFAULTS: dict[str, Any] = {  # Qwen/Qwen3-VL-2B-Instruct (the Thinking model has the same dims)
    "hidden_size": 2048,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 6144,
    "max_position_embeddings": 262144,
    "rope_theta": 5_000_000.0,
    "rms_norm_eps": 1e-6,
    "mrope_section": [24, 20, 20],
    "vision_depth": 24,
    "vision_hidden_size": 1024,
    "vision_intermediate_size": 4096,
    "vision_num_heads": 16,
    "vision_num_position_embeddings": 2304,
    "vision_deepstack_visual_indexes": [5, 11, 17],
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}
MODEL_DEFAULTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {  # family -> (tiny, full size)
    "qwen2_vl": (TINY_MODEL_DEFAULTS, FULL_SIZE_DEFAULTS),
    "qwen2_5_vl": (QWEN2_5_VL_TINY_DEFAULTS, QWEN2_5_VL_FULL_SIZE_DEFAULTS),
    "qwen3_vl": (QWEN3_VL_TINY_DEFAULTS, QWEN3_VL_FULL_SIZE_DEFAULTS),
}
# The real processors: Qwen2/2.5-VL resize into [4, 16384] merged tokens of 28x28 with OpenAI-CLIP normalisation;
# Qwen3-VL into [64, 16384] tokens of 32x32 (65536 .. 16777216 pixels) with mean = std = 0.5.
QWEN3_VL_MIN_PIXELS = 65536
QWEN3_VL_MAX_PIXELS = 16777216
PROCESSOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2_vl": {"min_pixels": REAL_MIN_PIXELS, "max_pixels": REAL_MAX_PIXELS, "patch_size": 14,
                 "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD},
    "qwen2_5_vl": {"min_pixels": REAL_MIN_PIXELS, "max_pixels": REAL_MAX_PIXELS, "patch_size": 14,
                   "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD},
    "qwen3_vl": {"min_pixels": QWEN3_VL_MIN_PIXELS, "max_pixels": QWEN3_VL_MAX_PIXELS, "patch_size": 16,
                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
}
# Qwen3-VL Thinking's generation_config.json samples (the model card's recommended top_p 0.95, top_k 20); the
# evaluation protocol decodes greedily regardless, and GRPO sets its own sampling.
QWEN3_VL_GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": BOS_TOKEN_ID,
    "pad_token_id": PAD_TOKEN_ID,
    "eos_token_id": [EOS_TOKEN_ID, BOS_TOKEN_ID],
    "do_sample": True,
    "temperature": 1.0,
    "top_p": 0.95,
    "top_k": 20,
}
# Overrides that are not model-config fields.
PROCESSOR_OVERRIDE_KEYS = ("min_pixels", "max_pixels")
BUILD_MARKER_FILE = "tiny_model.json"  # written into every built dir: how it was built (and that it may be rebuilt)
TRAINED_MARKERS = ("trainer_state.json", "training_meta.json", "adapter_config.json", "optimizer.pt")
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


def train_byte_level_bpe(vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
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


def _family(family: str):
    return get_family(family, where=f"the tiny-model family {family!r}")


def build_tokenizer(bpe_vocab_size: int = DEFAULT_BPE_VOCAB_SIZE, family: str = "qwen2_vl", thinking: bool = True):
    """A `Qwen2Tokenizer` (the class every family's tokenizer_config names): a small trained BPE, the real added ids."""
    _family(family)
    added = ADDED_TOKENS[family]
    vocab, merges = train_byte_level_bpe(bpe_vocab_size)
    trained_size = len(vocab)
    if trained_size >= FIRST_SPECIAL_TOKEN_ID:
        raise ValueError(f"trained BPE has {trained_size} tokens; it must stay below {FIRST_SPECIAL_TOKEN_ID}")
    # Placeholders are in the BPE vocab but no merge produces them, so no text ever encodes to them.
    for token_id in range(trained_size, FIRST_SPECIAL_TOKEN_ID):
        vocab[PLACEHOLDER_TOKEN_FORMAT.format(token_id)] = token_id
    if len(vocab) != FIRST_SPECIAL_TOKEN_ID:
        raise AssertionError("placeholder names collided with trained tokens")

    return qwen2_tokenizer(vocab, merges, added, chat_template(family, thinking),
                           model_max_length=262144 if family == "qwen3_vl" else (131072 if family == "qwen2_5_vl"
                                                                                 else 32768))


def qwen2_tokenizer(vocab: dict[str, int], merges: list, added: dict[str, int], chat_template: str,
                    model_max_length: int):
    """A `Qwen2Tokenizer` over a BPE (`vocab`, `merges`) with the `added` tokens at their ids (special where the real
    files mark them special), Qwen2's settings, `chat_template`; the ids are checked."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    special_tokens = [token for token in added if token in SPECIAL_TOKENS]
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        # Passing the ids makes them added in id order, right after the vocab: exactly the ids asked for.
        added_tokens_decoder={
            token_id: AddedToken(token, special=token in SPECIAL_TOKENS, normalized=False, lstrip=False, rstrip=False)
            for token, token_id in added.items()
        },
        extra_special_tokens=special_tokens[1:],  # the real `additional_special_tokens`
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        errors="replace",
        split_special_tokens=False,
        chat_template=chat_template,
    )
    check_special_token_ids(tokenizer, added)
    return tokenizer


def check_special_token_ids(tokenizer, added: dict[str, int] = QWEN2VL_SPECIAL_TOKENS) -> None:
    wrong = {
        token: tokenizer.convert_tokens_to_ids(token)
        for token, token_id in added.items()
        if tokenizer.convert_tokens_to_ids(token) != token_id
    }
    if wrong:
        raise AssertionError(f"special tokens got the wrong ids: {wrong}")


# ---------------------------------------------------------------------------------------------------------------------
# Processor
# ---------------------------------------------------------------------------------------------------------------------


def build_processor(tokenizer=None, min_pixels: int | None = None, max_pixels: int | None = None,
                    family: str = "qwen2_vl", thinking: bool = True):
    """The family's processor = the tokenizer + the real image-processor settings (pixel budget overridable)."""
    import transformers
    from transformers import Qwen2VLImageProcessor

    record = _family(family)
    defaults = PROCESSOR_DEFAULTS[family]
    if tokenizer is None:
        tokenizer = build_tokenizer(family=family, thinking=thinking)
    min_pixels = defaults["min_pixels"] if min_pixels is None else min_pixels
    max_pixels = defaults["max_pixels"] if max_pixels is None else max_pixels
    # A fresh `size` dict rather than min_pixels=/max_pixels=: in 5.17 those kwargs write into the class-level
    # default dict, leaking into every later Qwen2VLImageProcessor in the process. All three families use
    # Qwen2VLImageProcessor (Qwen3-VL with 16 px patches).
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": int(min_pixels), "longest_edge": int(max_pixels)},
        patch_size=record.patch_size,
        temporal_patch_size=2,
        merge_size=record.merge_size,
        image_mean=list(defaults["image_mean"]),
        image_std=list(defaults["image_std"]),
    )
    video_class = "Qwen3VLVideoProcessor" if family == "qwen3_vl" else "Qwen2VLVideoProcessor"
    video_processor = getattr(transformers, video_class)()
    return getattr(transformers, record.processor_class)(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=chat_template(family, thinking),
    )


# ---------------------------------------------------------------------------------------------------------------------
# Model config and weights
# ---------------------------------------------------------------------------------------------------------------------


def _default_mrope_section(head_dim: int, family: str = "qwen2_vl") -> list[int]:
    """Split head_dim/2 rotary frequencies into (temporal, height, width) as the real model does: 16, 24, 24 of 64
    (Qwen2/2.5-VL); Qwen3-VL interleaves them and gives temporal the most, 24, 20, 20 of 64."""
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


_CONFIG_CLASSES = {  # family -> (config, text config, vision config) class names in transformers
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLTextConfig", "Qwen2VLVisionConfig"),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLTextConfig", "Qwen2_5_VLVisionConfig"),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLTextConfig", "Qwen3VLVisionConfig"),
}


def _vision_base(family: str, text_hidden: int) -> dict[str, Any]:
    """The vision-config fields every checkpoint of the family shares (sizes come from the defaults/overrides)."""
    if family == "qwen2_vl":
        return {"depth": 32, "embed_dim": 1280, "hidden_size": text_hidden, "hidden_act": "quick_gelu",
                "mlp_ratio": 4, "num_heads": 16, "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2,
                "temporal_patch_size": 2, "initializer_range": INITIALIZER_RANGE}
    if family == "qwen2_5_vl":
        return {"hidden_act": "silu", "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2,
                "temporal_patch_size": 2, "tokens_per_second": 2, "out_hidden_size": text_hidden,
                "initializer_range": INITIALIZER_RANGE}
    return {"hidden_act": "gelu_pytorch_tanh", "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "out_hidden_size": text_hidden, "initializer_range": INITIALIZER_RANGE}


def _check_vision(family: str, vision: dict[str, Any]) -> None:
    depth = int(vision.get("depth", 0))
    if family == "qwen2_5_vl":
        bad = [i for i in vision.get("fullatt_block_indexes", []) if i not in range(depth)]
        if bad:
            raise ValueError(f"vision_fullatt_block_indexes {bad} are outside range(vision_depth={depth})")
    if family == "qwen3_vl":
        bad = [i for i in vision.get("deepstack_visual_indexes", []) if i not in range(depth)]
        if bad:
            raise ValueError(f"vision_deepstack_visual_indexes {bad} are outside range(vision_depth={depth})")
        side = round(int(vision["num_position_embeddings"]) ** 0.5)
        if side * side != int(vision["num_position_embeddings"]):
            raise ValueError(f"vision_num_position_embeddings {vision['num_position_embeddings']} must be a perfect "
                             "square (a learned side x side grid)")


def build_config(full_size: bool = False, family: str = "qwen2_vl", **overrides: Any):
    """The family's config: tiny or the real sizes, with the real vocab and special-token ids.

    Overrides: any text-config field (`hidden_size`, `num_hidden_layers`, ...), `rope_theta`, `mrope_section`,
    `vision_<field>` for the vision config (`vision_depth`, `vision_embed_dim` / `vision_hidden_size`, ...),
    `tie_word_embeddings`, `dtype`.
    """
    import transformers

    record = _family(family)
    config_class, text_class, vision_class = (getattr(transformers, name) for name in _CONFIG_CLASSES[family])
    settings = dict(MODEL_DEFAULTS[family][1 if full_size else 0])
    settings.update(overrides)
    vision = {key[len("vision_"):]: settings.pop(key) for key in list(settings) if key.startswith("vision_")}
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
    if family == "qwen3_vl":
        rope_parameters["mrope_interleaved"] = True
        text_extra = {"attention_bias": False, "attention_dropout": 0.0, "pad_token_id": PAD_TOKEN_ID}
    else:
        text_extra = {"use_sliding_window": False, "max_window_layers": settings["num_hidden_layers"],
                      "attention_dropout": 0.0, "bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID,
                      "pad_token_id": PAD_TOKEN_ID}
    text_config = {
        "vocab_size": REAL_VOCAB_SIZE,
        "hidden_act": "silu",
        "initializer_range": INITIALIZER_RANGE,
        **text_extra,
        "rope_parameters": rope_parameters,
        "dtype": dtype,
        **settings,
    }
    vision_config = {**_vision_base(family, text_config["hidden_size"]), **vision}
    _check_vision(family, vision_config)
    top_level = {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID, "pad_token_id": PAD_TOKEN_ID} \
        if family == "qwen2_vl" else {}
    return config_class(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=QWEN2VL_SPECIAL_TOKENS["<|image_pad|>"],
        video_token_id=QWEN2VL_SPECIAL_TOKENS["<|video_pad|>"],
        vision_start_token_id=QWEN2VL_SPECIAL_TOKENS["<|vision_start|>"],
        vision_end_token_id=QWEN2VL_SPECIAL_TOKENS["<|vision_end|>"],
        tie_word_embeddings=tie_word_embeddings,
        architectures=[record.class_name],
        dtype=dtype,
        **top_level,
    )


def _model_class(config):
    return get_family(config.model_type).model_class()


def count_parameters(config) -> int:
    """Parameter count of a config without allocating weights (built on the meta device); tied weights count once."""
    import torch

    with torch.device("meta"):
        model = _model_class(config)(config)
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
        if "Norm" in type(module).__name__  # nn.LayerNorm and the families' RMSNorms
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


def build_model(config, seed: int = 0, thinking: bool = True):
    """The family's `*ForConditionalGeneration` for `config` with seeded weights, in the config's dtype."""
    import torch
    from transformers.initialization import no_init_weights

    dtype = getattr(torch, str(config.dtype).removeprefix("torch.")) if config.dtype else torch.float32
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # allocate directly in the target dtype (halves peak memory for full size)
    try:
        # Every weight is overwritten below, so skip torch's and transformers' own init (half the full-size build).
        with no_init_weights():
            model = _model_class(config)(config)
    finally:
        torch.set_default_dtype(previous_dtype)
    model.tie_weights()  # no_init_weights also skips the tying that init_weights does
    initialize_weights(model, seed=seed, std=INITIALIZER_RANGE)
    model.generation_config = build_generation_config(config.model_type, thinking)
    return model.eval()


def build_generation_config(family: str = "qwen2_vl", thinking: bool = True):
    from transformers import GenerationConfig

    values = QWEN3_VL_GENERATION_CONFIG if family == "qwen3_vl" and thinking else REAL_GENERATION_CONFIG
    return GenerationConfig(**values)


def unused_token_ids(tokenizer, vocab_size: int = REAL_VOCAB_SIZE) -> list[int]:
    """The ids no text encodes to: the placeholders between the trained BPE and the first special id, and the
    embedding rows past the tokenizer (``len(tokenizer)`` .. ``vocab_size``).

    A real checkpoint's trained vocabulary gives such ids (almost) no probability; a tiny model's random-init rows
    do not, and sampling at T 0.7 picks them (GRPO rollouts of the captioning stand-in drifted into them, run 15 in
    experiments/captioning/LOG.md). So a stand-in policy's generation config suppresses them (`build_tiny(...,
    suppress_unused=True)`); 1.7 MB of generation_config.json, and HF generate's `isin` over them each step."""
    names = tokenizer.convert_ids_to_tokens(list(range(FIRST_SPECIAL_TOKEN_ID)))
    placeholders = [i for i, name in enumerate(names) if name == PLACEHOLDER_TOKEN_FORMAT.format(i)]
    return placeholders + list(range(len(tokenizer), vocab_size))


# ---------------------------------------------------------------------------------------------------------------------
# The whole checkpoint
# ---------------------------------------------------------------------------------------------------------------------


def build_tiny(family: str, out_dir: str | os.PathLike, full_size: bool = False, seed: int = 0,
               overwrite: bool = False, **overrides: Any) -> Path:
    """Write a checkpoint directory of `family` (model, tokenizer, processor, generation config); return its path.

    Loadable with `AutoProcessor.from_pretrained(out_dir)` and `AutoModelForImageTextToText.from_pretrained(out_dir)`
    like the family's real checkpoint. Written to a temporary sibling directory then renamed into place, so a reader
    never sees a half-written checkpoint. An existing `out_dir` is replaced only when this builder wrote it and
    nothing was trained into it, or with `overwrite=True`; otherwise a ModelError says so.

    Overrides: `min_pixels` / `max_pixels` (image processor), `bpe_vocab_size` (tokenizer), `thinking` (Qwen3-VL:
    the Thinking chat template and generation config, default True), and any model-config override accepted by
    `build_config`. `suppress_unused=True` (default False): the generation config suppresses `unused_token_ids`,
    for a tiny model that stands in for a real one in sampled generation (the captioning stand-in's policy; the real
    files have no such list, their trained vocabulary does not need one).
    """
    _family(family)
    out_dir = Path(out_dir).resolve()
    check_replaceable(out_dir, overwrite)
    processor_overrides = {key: overrides.pop(key) for key in PROCESSOR_OVERRIDE_KEYS if key in overrides}
    bpe_vocab_size = int(overrides.pop("bpe_vocab_size", DEFAULT_BPE_VOCAB_SIZE))
    thinking = bool(overrides.pop("thinking", True))
    suppress_unused = bool(overrides.pop("suppress_unused", False))
    config = build_config(full_size=full_size, family=family, **overrides)

    tokenizer = build_tokenizer(bpe_vocab_size, family=family, thinking=thinking)
    processor = build_processor(tokenizer, family=family, thinking=thinking, **processor_overrides)
    model = build_model(config, seed=seed, thinking=thinking)
    if suppress_unused:  # HF generate and the graph decoder read it here, GRPO's rollouts too (open_r1.trainer)
        model.generation_config.suppress_tokens = unused_token_ids(tokenizer, config.get_text_config().vocab_size)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        model.save_pretrained(staging_dir)
        processor.save_pretrained(staging_dir)
        marker = {"builder": "open_r1.tiny_models", "family": family, "full_size": full_size, "seed": seed,
                  "thinking": thinking if family == "qwen3_vl" else None}
        (staging_dir / BUILD_MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        # mkdtemp (and transformers' own temp files) are private to the owner; a checkpoint is meant to be shared.
        for path in [staging_dir, *staging_dir.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        _swap_into_place(staging_dir, out_dir)
    except BaseException:
        shutil.rmtree(staging_dir, ignore_errors=True)
        raise
    return out_dir


def build_qwen2vl(out_dir: str | os.PathLike, full_size: bool = False, seed: int = 0, **overrides: Any) -> Path:
    """`build_tiny("qwen2_vl", ...)`: a checkpoint laid out like `Qwen/Qwen2-VL-2B-Instruct`."""
    return build_tiny("qwen2_vl", out_dir, full_size=full_size, seed=seed, **overrides)


def check_replaceable(out_dir: Path, overwrite: bool = False) -> None:
    """Refuse to replace a dir this builder did not write, or one a run trained into, unless `overwrite`."""

    if not out_dir.exists() or overwrite:
        return
    if not out_dir.is_dir():
        raise ModelError(f"{out_dir} exists and is not a directory; pick another --out")
    entries = {path.name for path in out_dir.iterdir()}
    if not entries:
        return
    trained = sorted(name for name in entries if name in TRAINED_MARKERS or name.startswith("checkpoint-"))
    if BUILD_MARKER_FILE in entries and not trained:
        return  # an earlier build of this tool: safe to rebuild
    what = f"a trained model ({', '.join(trained[:3])})" if trained else (
        "a model" if "config.json" in entries else f"{len(entries)} files not written by this builder")
    raise ModelError(f"{out_dir} already holds {what}; refusing to replace it. Pick another --out, or pass "
                     "--overwrite (overwrite=True) to delete it and build there")


def _swap_into_place(staging_dir: Path, out_dir: Path) -> None:
    """Rename `staging_dir` to `out_dir`, moving any previous `out_dir` aside first and deleting it afterwards."""
    previous_dir = None
    if out_dir.exists():
        previous_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.rename(out_dir, previous_dir / out_dir.name)
    os.rename(staging_dir, out_dir)
    if previous_dir is not None:
        shutil.rmtree(previous_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """CLI: build one checkpoint; prints its path. Exit 0, or 2 with `error: ...` for a bad request."""
    import sys

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=CliHelp)
    parser.add_argument("--family", default="qwen2_vl", choices=SUPPORTED, help="model family")
    parser.add_argument("--out", required=True, help="checkpoint directory to write (atomically)")
    parser.add_argument("--full-size", action="store_true", help="the real model's dimensions, random bf16 weights")
    parser.add_argument("--seed", type=int, default=0, help="weights are a pure function of the seed")
    parser.add_argument("--min-pixels", type=int, default=None, help="image processor min_pixels (the real one's)")
    parser.add_argument("--max-pixels", type=int, default=None, help="image processor max_pixels (the real one's)")
    parser.add_argument("--instruct", action="store_true",
                        help="qwen3_vl: the Instruct chat template (default: Thinking, prompt ends with <think>)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out even if it holds a trained model or files this tool did not write")
    parser.add_argument("--suppress-unused", action="store_true",
                        help="generation never samples the ids no text encodes to (a sampling stand-in policy)")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {
        key: value for key, value in (("min_pixels", args.min_pixels), ("max_pixels", args.max_pixels)) if value
    }
    if args.suppress_unused:
        overrides["suppress_unused"] = True
    if args.family == "qwen3_vl":
        overrides["thinking"] = not args.instruct
    try:
        out_dir = build_tiny(args.family, args.out, full_size=args.full_size, seed=args.seed,
                             overwrite=args.overwrite, **overrides)
    except (OpenR1Error, ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
