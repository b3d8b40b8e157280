"""Build Qwen-VL checkpoints laid out like the real ones (files, classes, token ids, chat template, processor and
generation config), tiny or at full size with random weights, for tests, CPU demos and GPU benchmarks.

The real weights cannot be downloaded here, yet training, evaluation and export must run on the real loading path
(`AutoProcessor` / `AutoModelForImageTextToText.from_pretrained`). Families (`open_r1.families`): `qwen2_vl` like
Qwen/Qwen2-VL-2B-Instruct, `qwen2_5_vl` like Qwen/Qwen2.5-VL-3B-Instruct, `qwen3_vl` like Qwen/Qwen3-VL-2B-Thinking
(`thinking=False`: the Instruct template). The tiny model (~10M parameters) keeps the real 151936-row embedding and
a BPE trained here, padded with placeholders up to the real added-token ids, so ids mean what they mean in the real
model. Weights are seeded per parameter name: a seed pins them.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from open_r1.errors import CliHelp, ModelError, OpenR1Error
from open_r1.families import SUPPORTED, get_family


def _ids(first: int, names: str) -> dict[str, int]:
    return {name: first + i for i, name in enumerate(names.split())}


# The real added tokens in id order; tokenizer, config and processor rely on these ids. Qwen2.5 adds tool-call and
# fill-in-the-middle tokens, Qwen3 tool responses and the think tags; as in the real files only Qwen2-VL's 14 are
# "special" (decode keeps the others).
QWEN2VL_SPECIAL_TOKENS: dict[str, int] = _ids(151643, """<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|>
    <|object_ref_end|> <|box_start|> <|box_end|> <|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|>
    <|vision_pad|> <|image_pad|> <|video_pad|>""")
_QWEN2_5_VL_ADDED_TOKENS = {**QWEN2VL_SPECIAL_TOKENS, **_ids(151657, """<tool_call> </tool_call> <|fim_prefix|>
    <|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> <|file_sep|>""")}
QWEN3_VL_ADDED_TOKENS: dict[str, int] = {**_QWEN2_5_VL_ADDED_TOKENS,
                                         **_ids(151665, "<tool_response> </tool_response> <think> </think>")}
ADDED_TOKENS = {"qwen2_vl": QWEN2VL_SPECIAL_TOKENS, "qwen2_5_vl": _QWEN2_5_VL_ADDED_TOKENS,
                "qwen3_vl": QWEN3_VL_ADDED_TOKENS}
FIRST_SPECIAL_TOKEN_ID = 151643  # = size of the real BPE vocabulary
REAL_VOCAB_SIZE = 151936  # embedding rows of the real model (padded past len(tokenizer))
PLACEHOLDER_TOKEN_FORMAT = "<|reserved_{}|>"  # fills BPE ids nothing encodes to, up to FIRST_SPECIAL_TOKEN_ID
BOS_TOKEN_ID = PAD_TOKEN_ID = QWEN2VL_SPECIAL_TOKENS["<|endoftext|>"]
EOS_TOKEN_ID = QWEN2VL_SPECIAL_TOKENS["<|im_end|>"]

# The chat template shipped with Qwen/Qwen2-VL-2B-Instruct (and Qwen2.5-VL-Instruct), verbatim.
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


def _qwen3_vl_chat_template(thinking: bool) -> str:
    """The Qwen3-VL template without tool calls: no default system prompt, Qwen2-VL's image/video placeholders,
    earlier assistant turns without their think block. Thinking: the turn after the last user turn keeps it
    (`<think>\n{reasoning}\n</think>\n\n{answer}`, so SFT trains the reasoning) and the generation prompt opens it."""
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
        + (
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


def chat_template(family: str, thinking: bool = True) -> str:
    return _qwen3_vl_chat_template(thinking) if family == "qwen3_vl" else QWEN2VL_CHAT_TEMPLATE


# The real generation_config.json files: Qwen2/2.5-VL effectively greedy (top_k 1), Qwen3-VL Thinking sampling (its
# model card's top_p 0.95, top_k 20). GRPO and the evaluation protocol set their own decoding.
_GENERATION_IDS = {"bos_token_id": BOS_TOKEN_ID, "pad_token_id": PAD_TOKEN_ID}
REAL_GENERATION_CONFIG: dict[str, Any] = {**_GENERATION_IDS, "eos_token_id": [EOS_TOKEN_ID, BOS_TOKEN_ID],
                                          "do_sample": True, "repetition_penalty": 1.0, "temperature": 0.01,
                                          "top_p": 0.001, "top_k": 1}
QWEN3_VL_GENERATION_CONFIG: dict[str, Any] = {**_GENERATION_IDS, "eos_token_id": [EOS_TOKEN_ID, BOS_TOKEN_ID],
                                              "do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 20}
# The real preprocessor_config.json pixel budget of Qwen2/2.5-VL: 4 .. 16384 merged patches of 28x28.
REAL_MIN_PIXELS = 56 * 56
REAL_MAX_PIXELS = 28 * 28 * 16384
INITIALIZER_RANGE = 0.02
DEFAULT_BPE_VOCAB_SIZE = 4096  # upper bound; the small corpus runs out of merges first (~2.5k tokens)
BUILD_MARKER_FILE = "tiny_model.json"  # written into every built dir: how it was built (and that it may be rebuilt)
TRAINED_MARKERS = ("trainer_state.json", "training_meta.json", "adapter_config.json", "optimizer.pt")

# build_config's defaults: text-config fields, `vision_<field>` for the vision config, rope_theta,
# tie_word_embeddings, dtype. The vision merger's output width follows the text hidden_size; mrope_section, when
# left out, is derived from head_dim in the real ratio. Full sizes: the public config.json of each real checkpoint.
_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "max_position_embeddings": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
         "tie_word_embeddings": True, "dtype": "float32"}  # fp32: bf16 CPU kernels are slow or missing
_TINY_VISION = {"vision_depth": 2, "vision_hidden_size": 32, "vision_intermediate_size": 64, "vision_num_heads": 4}
_FULL = {"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "dtype": "bfloat16"}
_CLIP_MEAN_STD = ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711])


@dataclass(frozen=True)
class _Spec:
    tiny: dict[str, Any]
    full: dict[str, Any]
    pixels: tuple[int, int]  # the real image processor's (min_pixels, max_pixels)
    mean_std: tuple[list[float], list[float]]
    model_max_length: int  # the real tokenizer_config's


_SPECS = {
    "qwen2_vl": _Spec(  # Qwen/Qwen2-VL-2B-Instruct
        tiny={**_TINY, "vision_depth": 2, "vision_embed_dim": 32, "vision_num_heads": 4, "vision_mlp_ratio": 4},
        full={**_FULL, "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
              "num_key_value_heads": 2, "intermediate_size": 8960, "max_position_embeddings": 32768,
              "rope_theta": 1e6, "vision_depth": 32, "vision_embed_dim": 1280, "vision_num_heads": 16,
              "vision_mlp_ratio": 4},
        pixels=(REAL_MIN_PIXELS, REAL_MAX_PIXELS), mean_std=_CLIP_MEAN_STD, model_max_length=32768),
    "qwen2_5_vl": _Spec(  # Qwen/Qwen2.5-VL-3B-Instruct: SwiGLU ViT with window attention
        # windows of 2 merged tokens per side: tiny images still see several windows
        tiny={**_TINY, **_TINY_VISION, "vision_window_size": 56, "vision_fullatt_block_indexes": [1],
              "vision_tokens_per_second": 2},
        full={**_FULL, "hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
              "num_key_value_heads": 2, "intermediate_size": 11008, "max_position_embeddings": 128000,
              "rope_theta": 1e6, "vision_depth": 32, "vision_hidden_size": 1280, "vision_intermediate_size": 3420,
              "vision_num_heads": 16, "vision_window_size": 112, "vision_fullatt_block_indexes": [7, 15, 23, 31],
              "vision_tokens_per_second": 2},
        pixels=(REAL_MIN_PIXELS, REAL_MAX_PIXELS), mean_std=_CLIP_MEAN_STD, model_max_length=131072),
    "qwen3_vl": _Spec(  # Qwen/Qwen3-VL-2B-{Instruct,Thinking}: 16 px patches, deepstack, interleaved M-RoPE
        # An 8x8 learned position grid (real: 48x48). Deepstack feature k is added to decoder layer k's output: with
        # 2 layers a second one would reach only the last layer (no gradient from the answer); the real 28-layer
        # model has 3, well before its last layer.
        tiny={**_TINY, **_TINY_VISION, "head_dim": 16, "rope_theta": 5e6, "vision_num_position_embeddings": 64,
              "vision_deepstack_visual_indexes": [0]},
        full={**_FULL, "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144, "max_position_embeddings": 262144,
              "rope_theta": 5e6, "mrope_section": [24, 20, 20], "vision_depth": 24, "vision_hidden_size": 1024,
              "vision_intermediate_size": 4096, "vision_num_heads": 16, "vision_num_position_embeddings": 2304,
              "vision_deepstack_visual_indexes": [5, 11, 17]},
        pixels=(65536, 16777216), mean_std=([0.5] * 3, [0.5] * 3), model_max_length=262144),  # 64 .. 16384 tokens
}

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
            lines.extend(question.format(plural=plural, color=color) + suffix for suffix in _PROMPT_SUFFIXES)
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
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    # Every byte encodes, as in Qwen2; the added tokens come after the placeholders, at their real ids.
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, special_tokens=[], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
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
    return qwen2_tokenizer(vocab, merges, ADDED_TOKENS[family], chat_template(family, thinking),
                           model_max_length=_SPECS[family].model_max_length)


def qwen2_tokenizer(vocab: dict[str, int], merges: list, added: dict[str, int], chat_template: str,
                    model_max_length: int):
    """A `Qwen2Tokenizer` with Qwen2's settings over a BPE (`vocab`, `merges`) with the `added` tokens at their ids
    (special where the real files mark them special); the ids are checked."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    special = [token for token in added if token in QWEN2VL_SPECIAL_TOKENS]
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        # Passing the ids makes them added in id order, right after the vocab: exactly the ids asked for.
        added_tokens_decoder={token_id: AddedToken(token, special=token in special, normalized=False)
                              for token, token_id in added.items()},
        extra_special_tokens=special[1:],  # the real `additional_special_tokens`
        model_max_length=model_max_length, clean_up_tokenization_spaces=False, errors="replace",
        split_special_tokens=False, chat_template=chat_template,
    )
    wrong = {token: tokenizer.convert_tokens_to_ids(token) for token in added}
    wrong = {token: token_id for token, token_id in wrong.items() if token_id != added[token]}
    if wrong:
        raise AssertionError(f"special tokens got the wrong ids: {wrong}")
    return tokenizer


def build_processor(tokenizer=None, min_pixels: int | None = None, max_pixels: int | None = None,
                    family: str = "qwen2_vl", thinking: bool = True):
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
        size={"shortest_edge": int(min_pixels), "longest_edge": int(max_pixels)}, patch_size=record.patch_size,
        temporal_patch_size=2, merge_size=record.merge_size, image_mean=list(spec.mean_std[0]),
        image_std=list(spec.mean_std[1]))
    video_processor = transformers.Qwen3VLVideoProcessor() if family == "qwen3_vl" else \
        transformers.Qwen2VLVideoProcessor()
    return getattr(transformers, record.processor_class)(image_processor=image_processor, tokenizer=tokenizer,
                                                        video_processor=video_processor,
                                                        chat_template=chat_template(family, thinking))


# ---------------------------------------------------------------------------------------------------------------------
# Model config and weights
# ---------------------------------------------------------------------------------------------------------------------


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
        raise ValueError(f"vision_num_position_embeddings {positions} must be a perfect square (a learned side x side "
                         "grid)")


def build_config(full_size: bool = False, family: str = "qwen2_vl", **overrides: Any):
    """The family's config, tiny or at the real sizes, with the real vocab and token ids. Overrides: any text-config
    field, `vision_<field>` for the vision config, `rope_theta`, `mrope_section`, `tie_word_embeddings`, `dtype`;
    fields not set here keep transformers' defaults, which are the real checkpoints' values."""
    import transformers

    record, spec = _family(family), _SPECS[family]
    prefix = record.class_name.removesuffix("ForConditionalGeneration")
    config_class, text_class, vision_class = (getattr(transformers, prefix + kind) for kind in
                                              ("Config", "TextConfig", "VisionConfig"))
    settings = {**(spec.full if full_size else spec.tiny), **overrides}
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
    token_ids = {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID, "pad_token_id": PAD_TOKEN_ID}
    if family == "qwen3_vl":
        rope_parameters["mrope_interleaved"] = True
        text_ids = {"pad_token_id": PAD_TOKEN_ID}
    else:  # no sliding window in any layer, as in the real config
        text_ids = {**token_ids, "max_window_layers": settings["num_hidden_layers"]}
    text_config = {"vocab_size": REAL_VOCAB_SIZE, **text_ids, "rope_parameters": rope_parameters, "dtype": dtype,
                   **settings}
    merger_width = "hidden_size" if family == "qwen2_vl" else "out_hidden_size"
    vision_config = {merger_width: text_config["hidden_size"], "patch_size": record.patch_size,
                     "spatial_merge_size": record.merge_size, **vision}
    _check_vision(vision_config)
    return config_class(
        text_config=text_config, vision_config=vision_config, tie_word_embeddings=tie_word_embeddings,
        image_token_id=QWEN2VL_SPECIAL_TOKENS["<|image_pad|>"], video_token_id=QWEN2VL_SPECIAL_TOKENS["<|video_pad|>"],
        vision_start_token_id=QWEN2VL_SPECIAL_TOKENS["<|vision_start|>"],
        vision_end_token_id=QWEN2VL_SPECIAL_TOKENS["<|vision_end|>"], architectures=[record.class_name], dtype=dtype,
        **(token_ids if family == "qwen2_vl" else {}),
    )


def count_parameters(config) -> int:
    """Parameter count of a config without allocating weights (built on the meta device); tied weights count once."""
    import torch

    with torch.device("meta"):
        model = get_family(config.model_type).model_class()(config)
    return sum(parameter.numel() for parameter in model.parameters())


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

    return GenerationConfig(**(QWEN3_VL_GENERATION_CONFIG if family == "qwen3_vl" and thinking
                               else REAL_GENERATION_CONFIG))


def unused_token_ids(tokenizer, vocab_size: int = REAL_VOCAB_SIZE) -> list[int]:
    """The ids no text encodes to: the placeholders, and the embedding rows past the tokenizer. A real model gives
    them ~no probability; a tiny random one does, so a stand-in policy that samples suppresses them (build_tiny's
    `suppress_unused`; run 15 in experiments/captioning/LOG.md)."""
    names = tokenizer.convert_ids_to_tokens(list(range(FIRST_SPECIAL_TOKEN_ID)))
    placeholders = [i for i, name in enumerate(names) if name == PLACEHOLDER_TOKEN_FORMAT.format(i)]
    return placeholders + list(range(len(tokenizer), vocab_size))


# ---------------------------------------------------------------------------------------------------------------------
# The whole checkpoint
# ---------------------------------------------------------------------------------------------------------------------


def build_tiny(family: str, out_dir: str | os.PathLike, full_size: bool = False, seed: int = 0,
               overwrite: bool = False, **overrides: Any) -> Path:
    """Write a checkpoint dir of `family` (model, tokenizer, processor, generation config) and return its path.

    Written beside `out_dir` and renamed into place, so no reader sees it half-written. An existing `out_dir` is
    replaced only when this builder wrote it and nothing was trained into it, or with `overwrite=True`. Overrides:
    `min_pixels` / `max_pixels`, `bpe_vocab_size`, `thinking` (Qwen3-VL template and generation config, default
    True), `suppress_unused` (default False: the generation config suppresses `unused_token_ids`, for a tiny model
    that samples in place of a real one) and any `build_config` override.
    """
    _family(family)
    out_dir = Path(out_dir).resolve()
    check_replaceable(out_dir, overwrite)
    pixels = {key: overrides.pop(key) for key in ("min_pixels", "max_pixels") if key in overrides}
    bpe_vocab_size = int(overrides.pop("bpe_vocab_size", DEFAULT_BPE_VOCAB_SIZE))
    thinking = bool(overrides.pop("thinking", True))
    suppress_unused = bool(overrides.pop("suppress_unused", False))
    config = build_config(full_size=full_size, family=family, **overrides)

    tokenizer = build_tokenizer(bpe_vocab_size, family=family, thinking=thinking)
    processor = build_processor(tokenizer, family=family, thinking=thinking, **pixels)
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
        previous_dir = None  # an old out_dir is moved aside before the rename, deleted after it: never half there
        if out_dir.exists():
            previous_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.rename(out_dir, previous_dir / out_dir.name)
        os.rename(staging_dir, out_dir)
        if previous_dir is not None:
            shutil.rmtree(previous_dir, ignore_errors=True)
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
    trained = sorted(name for name in entries if name in TRAINED_MARKERS or name.startswith("checkpoint-"))
    if not entries or (BUILD_MARKER_FILE in entries and not trained):
        return  # empty, or an earlier build of this tool: safe to rebuild
    what = f"a trained model ({', '.join(trained[:3])})" if trained else (
        "a model" if "config.json" in entries else f"{len(entries)} files not written by this builder")
    raise ModelError(f"{out_dir} already holds {what}; refusing to replace it. Pick another --out, or pass "
                     "--overwrite (overwrite=True) to delete it and build there")


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
    overrides: dict[str, Any] = {key: value for key, value in (("min_pixels", args.min_pixels),
                                                               ("max_pixels", args.max_pixels)) if value}
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
