"""Captioning task side: protocol parser, data rules, the caption_rm reward, best-of-N metrics, the stand-in.

CPU only and fast: the stand-in fixture renders a handful of 96x64 cartoons once per module; the RM is a fake
scorer injected through the reward's cache (the real RM has its own tests in tests/test_reward_model.py).
"""

from __future__ import annotations

import io
import itertools
import json
import math

import numpy as np
import pytest

from open_r1.errors import DataError, RewardConfigError
from open_r1.tasks.captioning import config as cconfig
from open_r1.tasks.captioning import data as cdata
from open_r1.tasks.captioning import evaluate as ev
from open_r1.tasks.captioning import protocol as P
from open_r1.tasks.captioning import rewards as cr
from open_r1.tasks.captioning import stage_rm
from standin.captioning import cartoons as S
from standin.captioning import oracle_eval as oe


def preference_pairs(dataset, k=3.0, se_from="precision", cap_per_contest=1000, seed=0):
    """The pair dataset of ``data.pair_indices``' pairs (the reference the tests read pairs through): ``contest``,
    ``image``, description, ``chosen`` (higher mean), ``rejected``, ``gap``, ``z`` (gap / combined SE)."""
    index = cdata.pair_indices(dataset, k, se_from, cap_per_contest, seed)
    chosen, rejected = index[:, 0], index[:, 1]
    mean = np.asarray(cdata._column(dataset, "mean"), dtype=np.float64)
    ses = cdata.standard_errors(dataset, se_from)
    captions = cdata._column(dataset, "caption")
    gap = mean[chosen] - mean[rejected]
    z = gap / np.maximum(np.sqrt(ses[chosen] ** 2 + ses[rejected] ** 2), 1e-12)
    base = dataset.select_columns(["contest", "image", *cdata._description_columns(dataset)]).select(chosen.tolist())
    columns = {
        "chosen": [captions[i] for i in chosen],
        "rejected": [captions[i] for i in rejected],
        "gap": gap.tolist(),
        "z": z.tolist(),
    }
    for name, values in columns.items():
        base = base.add_column(name, values)
    return base


def logit(p: float) -> float:
    return math.log(p / (1 - p))


# --------------------------------------------------------------------------------------------------------------------
# Protocol
# --------------------------------------------------------------------------------------------------------------------
GOOD = "The odd one is blue.</think>\n\n<caption>Nobody tell the blue cube.</caption>"


@pytest.mark.parametrize(
    "text, reason",
    [
        ("Maybe <caption>Inside think</caption> works.</think>\n\n", "caption_only_in_think"),
        ("Hmm.</think>\n\n<caption>One</caption>\n<caption>Two</caption>", "multiple_captions"),
        ("Hmm.</think>\n\n<caption>Line one\nline two</caption>", "multi_line"),
        ("Hmm.</think>\n\n<caption>   </caption>", "empty"),
        ("Hmm.</think>\n\n<caption></caption>", "empty"),
        ("Hmm.</think>\n\n<caption>No closing tag", "unclosed_caption"),
        ("Hmm.</think>\n\n<caption>" + " ".join(["word"] * 26) + "</caption>", "too_long"),
        ("Hmm.</think>\n\n<caption>Fine caption</caption> and then some commentary", "trailing_text"),
        ("Hmm.</think>\n\n<caption>Fine caption</caption><caption>", "multiple_captions"),
        ("Hmm.</think>\n\nHere it is: <caption>Fine caption</caption>", "text_before_caption"),
        ("Still thinking <caption>truncated mid-think", "no_think_close"),
        ("Hmm.</think>\n\n</think><caption>x</caption>", "multiple_think_close"),
        ("<think>a<think>b</think>\n\n<caption>x</caption>", "extra_think_open"),
        ("Hmm.</think>\n\nJust a caption without tags", "no_caption"),
        ("Hmm.</think>\n\n<caption>a </think-ish <caption x</caption>", "tag_in_caption"),
    ],
)
def test_parser_rejects_adversarial_completions(text, reason):
    parsed = P.parse_details(text)
    assert parsed.caption is None and P.parse_details(text).caption is None
    assert parsed.reason == reason


def test_parser_accepts_the_format_with_or_without_opening_think_and_eos():
    assert P.parse_details(GOOD).caption == "Nobody tell the blue cube."
    assert P.parse_details("<think>\n" + GOOD).caption == "Nobody tell the blue cube."
    assert P.parse_details("  <think>" + GOOD + "<|im_end|>\n").caption == "Nobody tell the blue cube."
    assert P.parse_details("x</think><caption>  padded  </caption>\n\n").caption == "padded"


def test_caption_inside_think_never_counts():
    # the think block's draft is ignored; the caption after </think> is the one
    text = "Draft <caption>the draft</caption> no.</think>\n\n<caption>the final</caption>"
    parsed = P.parse_details(text)
    assert parsed.caption == "the final" and parsed.caption_in_think


def test_word_limit_is_a_parameter():
    text = "x</think>\n\n<caption>" + " ".join(["w"] * 10) + "</caption>"
    assert P.parse_details(text, max_words=10).caption is not None
    assert P.parse_details(text, max_words=9).reason == "too_long"


def test_format_target_round_trips_and_rejects_bad_pieces():
    target = P.format_target("It is odd.", "Hello there")
    assert target == "It is odd.</think>\n\n<caption>Hello there</caption>"
    assert P.parse_details(target).caption == "Hello there"
    with pytest.raises(DataError):
        P.format_target("sneaky </think>", "x")
    with pytest.raises(DataError):
        P.format_target("ok", "two\nlines")


def test_messages_are_one_prompt_for_every_stage():
    desc = {"twist": "a twist", "scene": "a room", "entities": ["cat", "dog"]}
    messages = P.build_messages(desc)
    assert messages[0] == {"role": "system", "content": [{"type": "text", "text": P.SYSTEM_PROMPT}]}
    assert messages[1]["role"] == "user" and messages[1]["content"][0] == {"type": "image"}
    text = messages[1]["content"][1]["text"]
    assert text == f"{P.CAPTION_REQUEST}\nScene: a room\nTwist: a twist\nEntities: cat, dog"
    assert P.user_text(None) == P.CAPTION_REQUEST
    rm = P.rm_messages(desc, " A caption ")
    assert rm[:2] == messages
    assert rm[2] == {"role": "assistant", "content": [{"type": "text", "text": "<caption>A caption</caption>"}]}
    with pytest.raises(DataError, match="unknown description field"):
        P.user_text({"scnee": "typo"})
    synth = P.synthesis_messages(desc, "Cap")
    assert synth[0] == messages[0] and synth[1]["content"][1]["text"].startswith(text)


def test_trace_leak_check():
    assert P.trace_leaks_caption("it says nobody tell the blue cube", "Nobody tell the blue cube!")
    assert not P.trace_leaks_caption("the blue one stands out", "Nobody tell the blue cube!")
    assert P.trace_leaks_caption("a </think> tag", "x")


# --------------------------------------------------------------------------------------------------------------------
# Data: hand-made rows
# --------------------------------------------------------------------------------------------------------------------
def _png(color=(200, 10, 10)) -> dict:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": None}


def make_rows(rows: list[dict]):
    import datasets

    feats = datasets.Features(
        {
            "contest": datasets.Value("int64"),
            "image": datasets.Image(),
            "scene": datasets.Value("string"),
            "caption": datasets.Value("string"),
            "mean": datasets.Value("float64"),
            "precision": datasets.Value("float64"),
            "votes": datasets.Value("int64"),
        }
    )
    full = [
        {
            "image": _png((10 * r["contest"] % 255, 0, 0)),
            "scene": f"scene {r['contest']}",
            "votes": 16,
            "precision": 0.1,
            **r,
        }
        for r in rows
    ]
    return datasets.Dataset.from_list(full, features=feats)


def test_sigma_gap_rule_with_explicit_standard_error():
    rows = make_rows(
        [
            {"contest": 1, "caption": "a", "mean": 3.0, "precision": 0.4},
            {"contest": 1, "caption": "b", "mean": 2.0, "precision": 0.4},
            {"contest": 1, "caption": "c", "mean": 1.9, "precision": 0.4},
        ]
    )
    # precision as the SE: threshold 3 * sqrt(0.16 + 0.16) = 1.70 > every gap -> no pair
    with pytest.raises(DataError, match="no caption pair"):
        preference_pairs(rows, k=3.0, se_from="precision")
    # precision as a per-vote std, 16 votes: SE 0.1, threshold 0.424: (a,b) gap 1.0 and (a,c) 1.1 pass, (b,c) 0.1 not
    pairs = preference_pairs(rows, k=3.0, se_from="std_over_sqrt_votes")
    got = sorted(zip(pairs["chosen"], pairs["rejected"]))
    assert got == [("a", "b"), ("a", "c")]
    assert sorted(round(g, 6) for g in pairs["gap"]) == [1.0, 1.1]
    assert all(g > 0 for g in pairs["gap"])
    assert set(pairs.column_names) >= {"contest", "image", "scene", "chosen", "rejected", "gap"}
    assert "oracle" not in pairs.column_names


def test_gap_must_exceed_the_threshold_strictly():
    rows = make_rows(
        [
            {"contest": 1, "caption": "a", "mean": 1.0, "precision": 0.0},
            {"contest": 1, "caption": "b", "mean": 0.5, "precision": 0.0},
        ]
    )
    assert len(preference_pairs(rows, k=3.0)) == 1
    rows = make_rows(
        [
            {"contest": 1, "caption": "a", "mean": 1.0, "precision": 0.3},
            {"contest": 1, "caption": "b", "mean": 0.1, "precision": 0.4},  # threshold 3 * 0.5 = 1.5 > 0.9
            {"contest": 1, "caption": "c", "mean": -0.5, "precision": 0.4},  # a-c gap 1.5 == threshold: not a pair
        ]
    )
    with pytest.raises(DataError):
        preference_pairs(rows, k=3.0)


def test_cap_per_contest_is_a_seeded_random_subset_and_pairs_are_shuffled_across_contests():
    big = [{"contest": 7, "caption": f"c{i}", "mean": float(i), "precision": 0.0} for i in range(6)]  # 15 pairs
    small = [{"contest": 3, "caption": f"s{i}", "mean": float(i), "precision": 0.0} for i in range(3)]  # 3 pairs
    rows = make_rows(small + big)
    all_pairs = preference_pairs(rows, cap_per_contest=None)
    assert len(all_pairs) == 3 + 15
    capped = [preference_pairs(rows, cap_per_contest=4, seed=s) for s in range(5)]
    for pairs in capped:
        contests = list(pairs["contest"])
        assert contests.count(7) == 4 and contests.count(3) == 3
    assert capped[0]["chosen"] == preference_pairs(rows, cap_per_contest=4, seed=0)["chosen"]  # seeded
    big_subsets = {
        tuple(sorted((c, r) for c, r, k in zip(p["chosen"], p["rejected"], p["contest"]) if k == 7)) for p in capped
    }
    assert len(big_subsets) > 1  # not always the same (first) 4 pairs
    first_four = {("c1", "c0"), ("c2", "c0"), ("c3", "c0"), ("c4", "c0")}  # i<j order would give these
    assert any(set(s) != first_four for s in big_subsets)
    orders = {tuple(p["contest"]) for p in capped}
    assert any(order != tuple(sorted(order)) for order in orders)  # contests interleaved, not contest order
    with pytest.raises(DataError):
        preference_pairs(rows, cap_per_contest=0)


def test_pair_indices_are_the_rows_of_the_pair_dataset():
    rows = make_rows(
        [
            {"contest": c, "caption": f"{c}-{i}", "mean": float(i * (c + 1)), "precision": 0.1}
            for c in range(4)
            for i in range(5)
        ]
    )
    for cap in (None, 3):
        index = cdata.pair_indices(rows, k=3.0, cap_per_contest=cap, seed=2)
        pairs = preference_pairs(rows, k=3.0, cap_per_contest=cap, seed=2)
        captions = rows["caption"]
        assert [captions[i] for i in index[:, 0]] == pairs["chosen"]
        assert [captions[i] for i in index[:, 1]] == pairs["rejected"]
    with pytest.raises(DataError, match="cap_per_contest"):
        cdata.pair_indices(rows, cap_per_contest=0)


def test_split_by_contest_is_disjoint_and_complete():
    rows = make_rows([{"contest": c, "caption": f"{c}-{i}", "mean": float(i)} for c in range(20) for i in range(3)])
    splits = cdata.split_by_contest(rows, val_frac=0.2, test_frac=0.1, seed=1)
    sets = {name: set(split["contest"]) for name, split in splits.items()}
    assert sets["train"].isdisjoint(sets["val"]) and sets["train"].isdisjoint(sets["test"])
    assert sets["val"].isdisjoint(sets["test"])
    assert sets["train"] | sets["val"] | sets["test"] == set(range(20))
    assert (len(sets["val"]), len(sets["test"])) == (4, 2)
    assert sum(len(s) for s in splits.values()) == len(rows)  # every caption of a contest follows it
    other = cdata.split_by_contest(rows, val_frac=0.2, test_frac=0.1, seed=2)
    assert set(other["val"]["contest"]) != sets["val"] or set(other["test"]["contest"]) != sets["test"]


def test_top_k_and_sft_rows_format(tiny_model_dirs):
    from open_r1 import modeling

    processor = modeling.load_processor(str(tiny_model_dirs["qwen3_vl"]))
    rows = make_rows(
        [
            {"contest": 1, "caption": c, "mean": m}
            for c, m in [("low", 1.0), ("top", 3.0), ("mid", 2.0), ("lowest", 0.5)]
        ]
    )
    top = cdata.top_k_rows(rows, 2)
    assert sorted(top["caption"]) == ["mid", "top"]
    with pytest.raises(DataError, match="thinking"):
        cdata.sft_rows(rows, processor=processor)
    top = top.add_column("thinking", ["Because.", None])  # one trace dropped by synthesis
    sft = cdata.sft_rows(top, top_k=2, processor=processor)
    assert len(sft) == 1
    row = sft[0]
    kept = next(c for c, t in zip(top["caption"], top["thinking"]) if t)
    assert row["completion"] == P.format_target("Because.", kept) + "<|im_end|>\n"  # the template opened <think>
    prompt = P.build_messages({"scene": "scene 1"})
    assert row["prompt"] == processor.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    assert P.SYSTEM_PROMPT in row["prompt"] and P.user_text({"scene": "scene 1"}) in row["prompt"]
    assert len(row["images"]) == 1


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda r: r.remove_columns(["votes"]), "lacks column"),
        (
            lambda r: r.map(lambda x, i: {"mean": float("nan") if i == 1 else x["mean"]}, with_indices=True),
            "row 1: mean",
        ),
        (lambda r: r.map(lambda x, i: {"votes": -1 if i == 2 else x["votes"]}, with_indices=True), "row 2: votes"),
        (lambda r: r.map(lambda x, i: {"caption": " " if i == 0 else x["caption"]}, with_indices=True), "row 0: empty"),
    ],
)
def test_validation_names_the_problem(change, match):
    rows = make_rows([{"contest": 1, "caption": f"c{i}", "mean": float(i)} for i in range(3)])
    with pytest.raises(DataError, match=match):
        cdata.validate_captions(change(rows))


def test_validation_reports_unreadable_image_row():
    import datasets

    rows = make_rows([{"contest": c, "caption": "c", "mean": 1.0} for c in range(3)])
    raw = rows.cast_column("image", datasets.Image(decode=False))
    raw = raw.map(
        lambda x, i: {"image": {"bytes": b"not a png" if i == 2 else x["image"]["bytes"], "path": None}},
        with_indices=True,
    )
    broken = raw.cast_column("image", datasets.Image())
    with pytest.raises(DataError, match="row 2: unreadable image"):
        cdata.validate_captions(broken)


# --------------------------------------------------------------------------------------------------------------------
# caption_rm
# --------------------------------------------------------------------------------------------------------------------
class FakeRM:
    """Scores by caption length (a fixed rule), records what it was asked."""

    def __init__(self):
        self.calls = []

    def score(self, images, messages, batch_size=16):
        self.calls.append((list(images), messages))
        return [len(m[2]["content"][0]["text"]) / 10.0 - 2.0 for m in messages]


@pytest.fixture()
def fake_rm():
    rm = FakeRM()
    cr._RM_CACHE[cr._cache_key("fake/rm", "cpu")] = rm  # as if get_reward_model had loaded it
    yield rm
    cr._RM_CACHE.clear()


def _caption_score(caption: str) -> float:
    return len(f"<caption>{caption}</caption>") / 10.0 - 2.0


def test_caption_rm_gates_on_the_parser_and_passes_the_image(fake_rm):
    from open_r1.rewards import get_reward_funcs

    (reward,) = get_reward_funcs(
        ["caption_rm"], {"caption_rm": {"reward_model": "fake/rm", "device": "cpu", "fail_value": -0.25}}
    )
    assert reward.__name__ == "caption_rm"
    img_a, img_b, img_c = object(), object(), object()  # any object: the reward must hand over exactly these
    completions = [
        "a</think>\n\n<caption>Hi</caption>",
        "b <caption>only in think</caption>",  # fails
        [{"role": "assistant", "content": "c</think><caption>Hello you</caption>"}],
    ]
    logged = {}
    out = reward(
        completions=completions,
        prompts=None,
        image=[img_a, img_b, img_c],
        scene=["s1", "s2", "s3"],
        contest=[1, 2, 3],
        log_metric=lambda k, v: logged.__setitem__(k, v),
    )
    assert out[1] == -0.25
    assert out[0] == pytest.approx(cr.sigmoid(_caption_score("Hi")))
    assert out[2] == pytest.approx(cr.sigmoid(_caption_score("Hello you")))
    ((images, messages),) = fake_rm.calls  # one batched call, failures never scored
    assert images[0] is img_a and images[1] is img_c and len(images) == 2
    assert messages[0] == P.rm_messages({"scene": "s1"}, "Hi") and messages[1] == P.rm_messages(
        {"scene": "s3"}, "Hello you"
    )
    assert logged["caption_rm/format_ok"] == pytest.approx(2 / 3)
    assert logged["caption_rm/raw_mean"] == pytest.approx((_caption_score("Hi") + _caption_score("Hello you")) / 2)
    assert logged["caption_rm/sigmoid_mean"] == pytest.approx((out[0] + out[2]) / 2)
    assert logged["caption_rm/fail/no_think_close"] == pytest.approx(1 / 3)  # think never closed
    assert logged["caption_rm/caption_in_think"] == pytest.approx(1 / 3)
    assert logged["caption_rm/fail/caption_only_in_think"] == 0.0


def test_caption_rm_format_bonus_batches_and_all_fail(fake_rm):
    func = cr.caption_rm_reward(reward_model="fake/rm", device="cpu", format_bonus=0.2, batch_size=1)
    good = "x</think>\n\n<caption>Yo</caption>"
    out = func([good, good], image=["i1", "i2"])
    assert out == pytest.approx([0.2 + 0.8 * cr.sigmoid(_caption_score("Yo"))] * 2)
    assert len(fake_rm.calls) == 1  # the fake takes batch_size itself
    logged = {}
    assert func(["no tags", "x</think>"], image=None, log_metric=lambda k, v: logged.__setitem__(k, v)) == [0.0, 0.0]
    assert "caption_rm/raw_mean" not in logged  # nothing parsed: no fake average
    with pytest.raises(ValueError, match="image"):
        func([good], completion_ids=None)  # a parsed caption and no image column: say so
    # an `images` column (list per row) is accepted as well
    assert func([good], images=[["i1"]]) == pytest.approx([0.2 + 0.8 * cr.sigmoid(_caption_score("Yo"))])


def test_caption_rm_rejects_bad_params(fake_rm):
    for params in (
        {"reward_model": ""},
        {"reward_model": "not/a/dir"},
        {"reward_model": "x", "format_bonus": 1.0},
        {"reward_model": "x", "fail_value": float("nan")},
        {"reward_model": "x", "max_words": 0},
        {"reward_model": "x", "fail_value": "0"},
    ):
        with pytest.raises(RewardConfigError):
            cr.caption_rm_reward(**params)


# --------------------------------------------------------------------------------------------------------------------
# Best-of-N metrics on fixed fake outputs
# --------------------------------------------------------------------------------------------------------------------
def _records(spec: dict) -> list[dict]:
    """spec: contest -> list of (sigma or None for a failure, oracle, truncated)."""
    out = []
    for contest, samples in spec.items():
        for k, (p, oracle, truncated) in enumerate(samples):
            out.append(
                {
                    "contest": contest,
                    "sample_index": k,
                    "completion": "...",
                    "caption": None if p is None else f"cap{k}",
                    "rm_raw": None if p is None else logit(p),
                    "truncated": truncated,
                    "oracle": None if p is None else oracle,
                }
            )
    return out


POLICY = _records(
    {
        "A": [(0.8, 1.0, False), (None, None, True), (0.4, -1.0, False), (0.6, 2.0, False)],
        "B": [(None, None, True), (None, None, False), (0.5, 0.0, False), (0.9, -2.0, False)],
    }
)
BASELINE = _records(
    {
        "A": [(0.5, 2.0, False), (0.5, 2.0, False), (None, None, False), (0.3, 1.0, False)],
        "B": [(0.2, 1.0, False), (0.4, 1.5, False), (None, None, False), (None, None, False)],
    }
)


def test_expected_max_matches_enumeration():
    values = [0.0, 0.4, 0.6, 0.8, 0.1]
    for n in range(1, 6):
        brute = np.mean([max(c) for c in itertools.combinations(values, n)])
        assert ev.expected_max_of_subset(values, n) == pytest.approx(brute)


def test_policy_metrics_hand_computed():
    m = oe.policy_metrics(POLICY)
    assert m["cartoons"] == 2 and m["samples_per_cartoon"] == 4
    assert m["format_rate"] == pytest.approx((3 / 4 + 2 / 4) / 2)  # 0.625
    assert m["truncated_rate"] == pytest.approx((1 / 4 + 1 / 4) / 2)
    assert m["fail_as_zero"] == pytest.approx((0.45 + 0.35) / 2)  # A (0.8+0+0.4+0.6)/4, B (0+0+0.5+0.9)/4
    assert m["emitted_sigmoid"] == pytest.approx((0.6 + 0.7) / 2)
    assert m["bon@1"] == pytest.approx(m["fail_as_zero"])
    # A sorted [0, .4, .6, .8]: (0.4*1 + 0.6*2 + 0.8*3)/6 = 4.0/6; B [0, 0, .5, .9]: (0.5*2 + 0.9*3)/6 = 3.7/6
    assert m["bon@2"] == pytest.approx((4.0 / 6 + 3.7 / 6) / 2)
    assert m["bon@4"] == pytest.approx((0.8 + 0.9) / 2)
    assert m["bon@8"] is None  # N = 4
    assert m["oracle_pick"] == pytest.approx((1.0 + -2.0) / 2)  # RM-best: A sample 0 (oracle 1), B sample 3 (-2)
    assert m["oracle_emitted"] == pytest.approx((2.0 / 3 + -1.0) / 2)
    # the 3 failures of "..." completions, by the parser's reason
    assert m["format_failures"] == {"no_think_close": 3} and m["top_failure"] == "no_think_close"
    assert len(m["example_completions"]["failed"]) == 2


def test_rm_oracle_agreement_and_pick_vs_emitted_hand_computed():
    """On the policy's own captions: does the RM order pairs as the oracle does, and is its pick better than the
    mean?"""
    m = oe.policy_metrics(POLICY)
    # A emitted (sigma, oracle): (.8, 1), (.4, -1), (.6, 2): pairs agree, disagree (.8 > .6 but 1 < 2), agree -> 2/3;
    # B: (.5, 0), (.9, -2): disagree -> 0
    assert m["per_cartoon"]["A"]["rm_oracle_agreement"] == pytest.approx(2 / 3)
    assert m["per_cartoon"]["B"]["rm_oracle_agreement"] == 0.0
    assert m["rm_oracle_agreement"] == pytest.approx(1 / 3) and m["rm_oracle_pairs"] == 4
    # pick - mean emitted oracle: A 1 - 2/3, B -2 - (-1)
    assert m["pick_vs_emitted"]["diff"] == pytest.approx(((1 - 2 / 3) + (-2 + 1)) / 2)
    # oracle gaps under the margin are left out, RM ties count half
    close = _records({"A": [(0.8, 1.0, False), (0.4, 1.0 + oe.ORACLE_PAIR_MARGIN / 2, False), (0.8, 3.0, False)]})
    one = oe.policy_metrics(close)  # pairs (0, 2): an RM tie; (1, 2): agree; (0, 1): gap under the margin
    assert one["rm_oracle_pairs"] == 2 and one["rm_oracle_agreement"] == pytest.approx((0.5 + 1.0) / 2)
    assert oe.policy_metrics(_records({"A": [(0.8, 1.0, False), (None, None, False)]}))["rm_oracle_agreement"] is None
    table = oe.markdown_table({"policies": {"p": m}, "comparisons": {}})
    assert "RM–oracle agreement (own pairs)" in table and "0.333 (4)" in table


def test_oracle_parts_of_the_emitted_captions_and_of_the_rms_picks():
    records = POLICY[:4]  # cartoon A: emitted samples 0, 2, 3; the RM picks sample 0
    parts = {
        0: {"names_odd": 2.0, "absent": 0.0, "score": 2.0},
        2: {"names_odd": 0.0, "absent": -1.5, "score": -1.5},
        3: {"names_odd": 2.0, "absent": -1.5, "score": 0.5},
    }
    records = [{**r, "oracle_parts": parts.get(r["sample_index"]) if r["caption"] else None} for r in records]
    m = oe.policy_metrics(records)
    assert m["oracle_parts_emitted"] == pytest.approx({"names_odd": 4 / 3, "absent": -1.0, "score": 1 / 3})
    assert m["oracle_parts_pick"] == {"names_odd": 2.0, "absent": 0.0, "score": 2.0}
    table = oe.markdown_table({"policies": {"p": m}, "comparisons": {}})
    assert "| p | +1.33 → +2.00 | -1.00 → +0.00 |" in table
    assert oe.policy_metrics(POLICY)["oracle_parts_pick"] is None  # records without parts


def test_evaluate_policy_scores_the_oracle_and_its_parts(standin_dir, tiny_model_dirs, fake_rm, monkeypatch):
    """A parsed caption gets the stand-in's oracle score and its parts (standin.oracle_details of the cartoon)."""
    import open_r1.generation as generation
    from open_r1 import modeling

    _, paths = standin_dir
    data = cdata.load_captions(paths["val"], check_images="none")
    meta = json.loads(data[0]["scene_meta"])
    caption = f"Nobody tell {S.odd_object_phrase(meta)} it was adopted."
    texts = [P.format_target("odd one out.", caption), "no format"]

    def fake_generate(model, processor, prompts, images, max_new_tokens, **kwargs):
        return [texts[i % 2] for i in range(len(prompts))], [5] * len(prompts), [False] * len(prompts)

    monkeypatch.setattr(generation, "generate_texts", fake_generate)
    model_dir = tiny_model_dirs["qwen3_vl"]
    processor = modeling.load_processor(str(model_dir))
    records = oe.score(ev.evaluate_policy(None, processor, data, fake_rm, n=2, max_cartoons=1, decoder="hf"), data)
    parsed, failed = records
    assert parsed["caption"] == caption and failed["caption"] is None
    assert parsed["oracle_parts"] == S.oracle_details(caption, meta) and parsed["oracle_parts"]["names_odd"] > 0
    assert parsed["oracle"] == S.oracle_score(caption, meta)
    assert failed["oracle"] is None and failed["oracle_parts"] is None
    worst = min(S.oracle_score(r["caption"], meta) for r in data if r["contest"] == parsed["contest"])
    assert parsed["oracle_floor"] == failed["oracle_floor"] == pytest.approx(worst)
    assert oe.policy_metrics(records)["oracle_parts_pick"] == S.oracle_details(caption, meta)


def test_oracle_fail_as_worst_counts_a_failure_as_the_worst_candidate():
    floors = {"A": -3.0, "B": -4.0}
    policy = [{**r, "oracle_floor": floors[r["contest"]]} for r in POLICY]
    baseline = [{**r, "oracle_floor": floors[r["contest"]]} for r in BASELINE]
    m = oe.policy_metrics(policy)
    # A: oracles 1, -1, 2 and one failure (-3) -> -1/4; B: two failures (-4) and 0, -2 -> -10/4
    assert m["per_cartoon"]["A"]["oracle_fail_as_worst"] == pytest.approx(-1 / 4)
    assert m["oracle_fail_as_worst"] == pytest.approx((-1 / 4 + -10 / 4) / 2)
    # the baseline emits better captions (oracle_emitted higher) but fails more: the two measures disagree
    b = oe.policy_metrics(baseline)  # A: 2, 2, -3, 1 -> 0.5; B: 1, 1.5, -4, -4 -> -5.5 / 4
    assert b["oracle_fail_as_worst"] == pytest.approx((0.5 + -5.5 / 4) / 2)
    c = oe.compare(m, b, n_boot=200)
    assert c["oracle_emitted"]["diff"] < 0
    assert c["oracle_fail_as_worst"]["diff"] == pytest.approx(((-1 / 4 - 0.5) + (-10 / 4 + 5.5 / 4)) / 2)
    # a policy that never emits scores the floor, not None (oracle_emitted has nothing to average)
    silent = oe.policy_metrics([{**r, "oracle_floor": -3.0} for r in _records({"A": [(None, None, False)] * 2})])
    assert silent["oracle_emitted"] is None and silent["oracle_fail_as_worst"] == -3.0
    # without floors (not the stand-in) a failure leaves the measure undefined
    assert oe.policy_metrics(POLICY)["oracle_fail_as_worst"] is None
    assert "oracle, fail = worst" in oe.markdown_table({"policies": {"p": m}, "comparisons": {}})


def test_format_failures_count_the_parsers_reasons():
    records = [
        {"completion": "a</think>\n\n<caption>x</caption>", "caption": "x"},
        {"completion": "a</think>\n\n<caption>x", "caption": None},
        {"completion": "a</think>\n\n<caption>y", "caption": None},
        {"completion": "<caption>x</caption> a</think>", "caption": None},
        {"completion": "whatever", "caption": None, "parse_reason": "too_long"},
    ]  # the record's own verdict wins
    out = ev.format_failures(records, examples=1)
    assert out["format_failures"] == {"unclosed_caption": 2, "caption_only_in_think": 1, "too_long": 1}
    assert out["top_failure"] == "unclosed_caption"
    assert out["example_completions"] == {
        "failed": ["a</think>\n\n<caption>x"],
        "parsed": ["a</think>\n\n<caption>x</caption>"],
    }
    table = ev.markdown_table({"policies": {"p": {**ev.policy_metrics(POLICY)}}, "comparisons": {}})
    assert "commonest format failure" in table and "no_think_close (3/8)" in table


def test_fail_as_zero_is_on_the_sigmoid_scale():
    # a policy that always fails must not beat one that emits captions with (typical) negative raw BT scores
    fails = _records({"A": [(None, None, False)] * 4})
    emits = _records({"A": [(cr.sigmoid(-3.0), 0.0, False)] * 4})
    assert ev.policy_metrics(fails)["fail_as_zero"] == 0.0
    emitted = ev.policy_metrics(emits)["fail_as_zero"]
    assert emitted == pytest.approx(cr.sigmoid(-3.0)) and emitted > 0.0


def test_paired_comparison_and_reward_hacking_flag(tmp_path):
    report = oe.evaluate_records({"base": BASELINE, "grpo": POLICY}, baseline="base", n_boot=500, seed=0)
    c = report["comparisons"]["grpo"]
    base = oe.policy_metrics(BASELINE)
    # baseline per cartoon: fail-as-0 A (0.5+0.5+0+0.3)/4 = 0.325, B (0.2+0.4)/4 = 0.15; policy A 0.45, B 0.35
    assert base["fail_as_zero"] == pytest.approx((0.325 + 0.15) / 2)
    assert c["fail_as_zero"]["diff"] == pytest.approx(((0.45 - 0.325) + (0.35 - 0.15)) / 2)
    assert 0.125 - 1e-9 <= c["fail_as_zero"]["lo"] <= c["fail_as_zero"]["hi"] <= 0.2 + 1e-9  # between the two diffs
    # oracle of the RM pick: baseline A sample 0 (ties go to the first index) = 2.0, B sample 1 = 1.5
    assert c["oracle_pick"]["diff"] == pytest.approx(((1.0 - 2.0) + (-2.0 - 1.5)) / 2)
    assert c["reward_hacking"] is True and c["reward_hacking_significant"] is True
    same = oe.compare(base, base)
    assert same["fail_as_zero"]["diff"] == 0.0 and same["fail_as_zero"]["lo"] == same["fail_as_zero"]["hi"] == 0.0
    assert same["reward_hacking"] is False
    paths = ev.write_report(report, str(tmp_path), {"base": BASELINE, "grpo": POLICY}, oe.markdown_table(report))
    with open(paths["markdown"]) as f:
        table = f.read()
    assert "| grpo | 2 | 4 | 62.5 | 25.0 |" in table and "YES" in table
    with open(paths["json"]) as f:
        assert json.load(f)["comparisons"]["grpo"]["reward_hacking"] is True
    with open(paths["plot"], "rb") as f:
        assert f.read(4) == b"\x89PNG"


def test_paired_bootstrap_pairs_by_cartoon():
    policy = {"a": 1.0, "b": 2.0, "c": None}
    baseline = {"a": 0.5, "b": 2.5, "d": 9.0}
    out = ev.paired_bootstrap(policy, baseline, n_boot=200)
    assert out["cartoons"] == 2 and out["diff"] == pytest.approx(0.0)
    assert out["lo"] >= -0.5 - 1e-9 and out["hi"] <= 0.5 + 1e-9
    assert ev.paired_bootstrap({"a": 1.0}, {"b": 1.0}) is None


# --------------------------------------------------------------------------------------------------------------------
# Stand-in
# --------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("standin")
    config = S.StandinConfig(
        contests=8, ood_contests=2, val_frac=0.25, test_frac=0.125, captions=12, image_size=(96, 64), max_objects=5
    )
    paths = S.write_standin(out, config)
    return out, paths


def test_standin_rule_depends_on_the_image():
    scenes = [S.render_odd_scene(seed, "clevr", (96, 64))[1] for seed in range(12)]
    meta = next(m for m in scenes if m["dimension"] == "color")
    odd = meta["objects"][meta["odd_index"]]
    assert sum(o["color"] == meta["odd_value"] for o in meta["objects"]) == 1  # exactly one odd object
    present_colors = {o["color"] for o in meta["objects"]}
    absent = next(c for c in S.clevr.COLORS if c not in present_colors)
    absent_shape = next(s for s in S.clevr.SHAPES if s != odd["shape"])  # colour-odd scenes share one shape
    names_odd = f"Nobody tell {S.odd_object_phrase(meta)} it was adopted."
    names_absent = f"Nobody tell the {absent} {absent_shape} it was adopted."
    assert S.oracle_score(names_odd, meta) > S.oracle_score(names_absent, meta) + 1.0
    # the same caption on a rendered scene without that colour scores low: the rule reads the image content
    others = [m for m in scenes if meta["odd_value"] not in {o["color"] for o in m["objects"]}]
    assert others
    for other in others:
        # loses the odd-object bonus and pays for an absent colour (even where its shape happens to be the odd one)
        assert S.oracle_score(names_odd, other) <= S.oracle_score(names_odd, meta) - 2.0 + 1e-9
    # puns on the odd value score extra; length is penalised
    if meta["odd_value"] in S.PUNS:
        with_pun = names_odd[:-1] + f", talk about {S.PUNS[meta['odd_value']]}."
        assert S.oracle_details(with_pun, meta)["puns"] == S.W_PUN_ODD
    long = names_odd[:-1] + S.LONG_TAIL + "."
    assert S.oracle_details(long, meta)["length"] < 0


def test_standin_image_dependence_on_a_fixed_color_scene():
    meta = {
        "renderer": "clevr",
        "dimension": "color",
        "odd_index": 0,
        "odd_value": "blue",
        "majority_value": "red",
        "objects": [{"shape": "cube", "color": "blue", "size": "small"}]
        + [{"shape": "cube", "color": "red", "size": "small"}] * 3,
    }
    swapped = {
        **meta,
        "odd_value": "green",
        "objects": [{"shape": "cube", "color": "green", "size": "small"}]
        + [{"shape": "cube", "color": "red", "size": "small"}] * 3,
    }
    caption = "Nobody tell the blue cube it was adopted."
    absent = "Nobody tell the purple sphere it was adopted."
    assert S.oracle_score(caption, meta) > S.oracle_score(absent, meta)
    assert S.oracle_score(caption, meta) - S.oracle_score(caption, swapped) >= 2.0 + 0.5 + 1.5 - 1e-9


def test_standin_splits_layout_and_oracle_kept_out_of_training(standin_dir, tiny_model_dirs):
    from open_r1 import modeling

    _, paths = standin_dir
    assert set(paths) == {"train", "val", "test", "ood"}
    contests = {name: set(cdata.load_captions(p)["contest"]) for name, p in paths.items()}
    for a, b in itertools.combinations(contests, 2):
        assert contests[a].isdisjoint(contests[b])
    train = cdata.load_captions(paths["train"])
    assert set(cdata.REQUIRED_COLUMNS) <= set(train.column_names)
    with_oracle = train  # the stand-in's analysis column rides along: no engine row builder names it
    assert "oracle" in with_oracle.column_names
    ood = cdata.load_captions(paths["ood"])
    assert set(ood["renderer"]) == {"ood"} and set(train["renderer"]) == {"clevr"}
    # what training reads never has the oracle, even when loaded with it
    for rows in (
        cdata.sft_rows(
            S.add_templated_thinking(cdata.top_k_rows(with_oracle, 3)),
            processor=modeling.load_processor(str(tiny_model_dirs["qwen3_vl"])),
        ),
        preference_pairs(with_oracle, cap_per_contest=20),
        cdata.prompt_rows(with_oracle),
        S.pretrain_rows(with_oracle),
    ):
        assert not any("oracle" in c for c in rows.column_names)
        assert "oracle" not in json.dumps(rows[0], default=str)
    # the descriptions never name the odd object: it is only in the image
    meta = json.loads(train[0]["scene_meta"])
    text = P.user_text(P.description_from_row(train[0]))
    assert meta["odd_value"] not in text.lower()
    # stand-in votes agree with the oracle on the pairs the k-sigma rule keeps
    index = cdata.pair_indices(with_oracle, k=3.0, se_from="precision", cap_per_contest=50, seed=0)
    oracle = np.array(with_oracle["oracle"])
    assert np.mean(oracle[index[:, 0]] > oracle[index[:, 1]]) > 0.9


def test_standin_contests_do_not_depend_on_the_processs_hash_seed():
    """Two processes with different PYTHONHASHSEEDs render the same candidate captions (a set of strings iterates in
    a per-process order; the generator picked from such an order by position, so runs differed)."""
    import os
    import subprocess
    import sys

    code = (
        "import json; from standin.captioning import cartoons as S; c = S.StandinConfig(captions=24, "
        "image_size=(96, 64)); print(json.dumps([[r['caption'] for r in S.make_contest(c, s, i)] "
        "for s in ('main', 'ood') for i in range(6)]))"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outs = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root},
        ).stdout
        for seed in ("1", "2")
    ]
    assert json.loads(outs[0]) == json.loads(outs[1])


def test_standin_is_deterministic_and_pretrain_rows_format(standin_dir):
    config = S.StandinConfig(captions=6, image_size=(96, 64), max_objects=4)
    a, b = S.make_contest(config, "main", 5), S.make_contest(config, "main", 5)
    assert [r["caption"] for r in a] == [r["caption"] for r in b] and [r["mean"] for r in a] == [r["mean"] for r in b]
    assert a[0]["image"]["bytes"] == b[0]["image"]["bytes"]
    assert all(r["precision"] >= 0 and r["votes"] >= config.min_votes for r in a)
    _, paths = standin_dir
    train = cdata.load_captions(paths["train"])
    rows = S.pretrain_rows(train, per_contest=2)
    assert set(rows["kind"]) == {"describe", "question", "fluency"}
    fluency = rows.filter(lambda r: r["kind"] == "fluency")[0]
    assert fluency["prompt"][0]["content"][0]["text"] == P.SYSTEM_PROMPT
    assert P.parse_details(fluency["completion"][0]["content"][0]["text"]).caption is not None
    thinking = S.templated_thinking(train[0])
    assert not P.trace_leaks_caption(thinking, train[0]["caption"]) or "talk about" in train[0]["caption"]
    # the "joke" wording: the same facts without the word that shares the <caption> tag's sub-words
    joke = S.templated_thinking(train[0], wording="joke")
    assert joke == thinking.replace("A good caption", "A good joke") and "caption" not in joke
    with pytest.raises(DataError, match="wording must be one of"):
        S.templated_thinking(train[0], wording="pun")
    # the first sentence alone: what is odd, the odd object named once, the same text as the full trace's start
    first = S.templated_thinking(train[0], template="first_sentence")
    meta = train[0]["scene_meta"]
    odd = S.odd_object_phrase(json.loads(meta) if isinstance(meta, str) else meta)
    assert thinking.startswith(first + " A good caption") and first.endswith(".") and first.count(odd) == 1
    assert thinking.count(odd) == 2 and S.templated_thinking(train[0], "joke", "first_sentence") == first
    with pytest.raises(DataError, match="template must be one of"):
        S.templated_thinking(train[0], template="short")


def test_pretrain_and_sft_rows_pass_the_stored_images_through_without_reencoding(
    standin_dir, tiny_model_dirs, monkeypatch
):
    import datasets
    from PIL import Image

    from open_r1 import modeling

    processor = modeling.load_processor(str(tiny_model_dirs["qwen3_vl"]))
    _, paths = standin_dir
    train = cdata.load_captions(paths["train"])

    def no_save(*args, **kwargs):  # re-encoding each image cost ~80 % of the rows' build
        raise AssertionError("an image was re-encoded")

    stored = {image["bytes"] for image in train.cast_column("image", datasets.Image(decode=False))["image"]}
    traced = S.add_templated_thinking(cdata.top_k_rows(train, 2))
    monkeypatch.setattr(Image.Image, "save", no_save)
    for rows in (S.pretrain_rows(train, per_contest=2), cdata.sft_rows(traced, top_k=2, processor=processor)):
        assert rows.features["images"] == datasets.List(datasets.Image())
        raw = rows.cast_column("images", datasets.List(datasets.Image(decode=False)))["images"]
        assert all(len(r) == 1 and r[0]["bytes"] in stored for r in raw)
        assert rows[0]["images"][0].size == train[0]["image"].size  # still decodes to the picture


def test_perception_probe_reads_the_odd_value_strictly(standin_dir):
    meta = {
        "renderer": "clevr",
        "dimension": "color",
        "odd_index": 0,
        "odd_value": "blue",
        "majority_value": "red",
        "objects": [{"shape": "cube", "color": "blue"}] + [{"shape": "cube", "color": "red"}] * 3,
    }
    assert S.perceives_odd("The blue cube.", meta) and S.perceives_odd("</think>\n\nthe BLUE box", json.dumps(meta))
    assert not S.perceives_odd("The red cube.", meta)  # a majority value
    assert not S.perceives_odd("The blue or red cube.", meta)  # two values of the odd dimension
    assert not S.perceives_odd("It is feeling blue.", meta)  # a pun is not a name (as the oracle reads it)
    shape = {**meta, "dimension": "shape", "odd_value": "sphere", "majority_value": "cube"}
    assert S.perceives_odd("The red ball.", shape) and not S.perceives_odd("The red cube.", shape)
    # one probe row per held-out contest, in the pre-training question format, the answer from the scene itself
    _, paths = standin_dir
    val = cdata.load_captions(paths["val"])
    rows = S.perception_probe_rows(val)
    assert len(rows) == len(set(val["contest"])) and len(S.perception_probe_rows(val, limit=1)) == 1
    assert rows[0]["messages"][0]["content"][1]["text"] == S.PROBE_QUESTION
    scene = json.loads(rows[0]["scene_meta"])
    assert S.perceives_odd(S.odd_object_phrase(scene), scene)  # the pre-training answer passes its own probe
    assert not S.perceives_odd(S.scene_description(scene), scene)  # the description names both values


def test_exposure_scenes_are_disjoint_images_one_row_each():
    config = S.StandinConfig(captions=6, image_size=(96, 64), max_objects=4)
    scenes = S.build_contests(2, config, "main", start=50_000, rows_per_contest=1)
    assert scenes["contest"] == [50_000, 50_001]
    # the same index, the same scene
    assert scenes[0]["caption"] == S.make_contest(config, "main", 50_000)[0]["caption"]


def test_standin_cli(tmp_path):
    out = tmp_path / "cli"
    assert (
        S.main(
            [
                "--out",
                str(out),
                "--contests",
                "4",
                "--ood-contests",
                "1",
                "--captions",
                "6",
                "--image-size",
                "96x64",
                "--max-objects",
                "4",
                "--val-frac",
                "0.25",
                "--test-frac",
                "0.25",
            ]
        )
        == 0
    )
    with open(out / "standin.json") as f:
        assert json.load(f)["splits"]["ood"]["contests"] == 1
    assert S.main(["--out", str(out), "--contests", "4"]) == 2  # refuses to overwrite without --overwrite


# --------------------------------------------------------------------------------------------------------------------
# Task interface (GRPO prompts + in-training evaluation), with a tiny Qwen3-VL and the fake RM
# --------------------------------------------------------------------------------------------------------------------
def test_task_train_prompts_and_eval_report(standin_dir, tiny_model_dirs, fake_rm):
    from types import SimpleNamespace

    from open_r1 import modeling
    from open_r1.grpo import GRPOScriptArguments
    from open_r1.tasks import get_task
    from open_r1.tasks.captioning import CaptioningSettings

    _, paths = standin_dir
    args = GRPOScriptArguments(
        task="captioning",
        dataset_name=paths["train"],
        dataset_train_split="train",
        max_train_samples=3,
        reward_kwargs=json.dumps({"caption_rm": {"reward_model": "fake/rm", "device": "cpu"}}),  # as on a command line
    )
    task = get_task("captioning", args, CaptioningSettings(caption_eval_max_new_tokens=8))
    train = task.train_dataset(args, SimpleNamespace(seed=0))
    assert len(train) == 3 and len(set(train["contest"])) == 3
    assert train[0]["prompt"][1]["content"][1]["text"] == P.user_text(P.description_from_row(train[0]))
    assert not any("oracle" in c or c == "scene_meta" for c in train.column_names)
    sets = task.load_eval_sets([paths["val"], paths["ood"]], limit=2)
    assert set(sets) == {"val", "ood"} and all(len(s) <= 2 for s in sets.values())
    model_dir = tiny_model_dirs["qwen3_vl"]
    model = modeling.load_model(str(model_dir), dtype="float32", attn_implementation="eager")
    processor = modeling.load_processor(str(model_dir))
    report = task.evaluate(model.eval(), processor, sets["val"], name="val", batch_size=2)
    assert report.n == len(sets["val"]) and 0.0 <= report.score <= 1.0
    assert all(r["index"] in range(len(sets["val"])) for r in report.records)
    assert set(report.summary()) >= {"name", "n", "format_rate", "fail_as_zero"}
    rebuilt = task.report_from_records("val", report.records, 1.0)
    assert rebuilt.score == report.score


def test_evaluate_policy_without_a_reward_model_parses_and_leaves_rm_scores_empty(
    standin_dir, tiny_model_dirs, fake_rm
):
    """reward_model=None: a format-only look at a policy (no RM asked); with one, the same samples get scores."""
    from open_r1 import modeling
    from open_r1.tasks.captioning import evaluate as ev

    _, paths = standin_dir
    data = cdata.load_captions(paths["val"], check_images="none")
    model_dir = tiny_model_dirs["qwen3_vl"]
    model = modeling.load_model(str(model_dir), dtype="float32", attn_implementation="eager").eval()
    processor = modeling.load_processor(str(model_dir))
    kwargs = dict(n=2, max_new_tokens=6, batch_size=3, max_cartoons=2, seed=0, decoder="hf")
    seen = []
    plain = ev.evaluate_policy(
        model, processor, data, None, progress=lambda done, total: seen.append((done, total)), **kwargs
    )
    assert len(plain) == 4 and all(r["rm_raw"] is None and r["parse_reason"] for r in plain)
    assert seen == [(3, 4), (4, 4)]  # after each batch of 3
    assert not fake_rm.calls
    # a parsed caption is scored when an RM is given (one record made to parse: the tiny model's text would not)
    records = [{**plain[0], "caption": "A caption."}, plain[1]]
    images = {r["contest"]: data[0]["image"] for r in records}
    descs = {r["contest"]: None for r in records}
    scored = ev.score_records([dict(r) for r in records], images, descs, fake_rm)
    assert scored[0]["rm_raw"] == pytest.approx(len("<caption>A caption.</caption>") / 10.0 - 2.0)
    assert ev.score_records([dict(r) for r in records], images, descs, None)[0]["rm_raw"] is None


def test_caption_rm_with_the_real_reward_model_dir(standin_dir, tiny_model_dirs, tmp_path):
    """caption_rm loads the saved RM dir once (open_r1.reward_model) and scores the row's image + rm_messages."""
    import torch

    from open_r1.reward_model import build_reward_model

    rm = build_reward_model(str(tiny_model_dirs["qwen2_5_vl"]), dtype="float32", attn_implementation="eager")
    with torch.no_grad():  # a non-zero head, so that scores differ between inputs
        rm.head.weight.copy_(torch.randn_like(rm.head.weight, generator=torch.Generator().manual_seed(0)))
    rm_dir = rm.save(str(tmp_path / "rm"))
    _, paths = standin_dir
    rows = cdata.prompt_rows(cdata.load_captions(paths["val"]))
    images = rows["image"][:2]
    descs = [P.description_from_row(rows[i]) for i in range(2)]
    cr._RM_CACHE.clear()
    try:
        func = cr.caption_rm_reward(reward_model=rm_dir, device="cpu", batch_size=2)
        completion = "x</think>\n\n<caption>Nobody tell the blue cube.</caption>"
        kwargs = {f: [d.get(f) for d in descs] for f in P.DESCRIPTION_FIELDS}
        out = func(
            [completion, completion, "no caption"],
            image=[images[0], images[1], images[1]],
            **{k: v + [v[-1]] for k, v in kwargs.items()},
        )
        loaded = cr.get_reward_model(rm_dir, "cpu")
        assert (
            func([completion], image=[images[0]], **{k: v[:1] for k, v in kwargs.items()})
            and cr.get_reward_model(rm_dir, "cpu") is loaded
        )  # loaded once per process
        expected = loaded.score(images, [P.rm_messages(d, "Nobody tell the blue cube.") for d in descs])
        assert out[:2] == pytest.approx([cr.sigmoid(s) for s in expected], abs=1e-5)
        assert out[0] != pytest.approx(out[1])  # the image (and its description) changes the score
        assert out[2] == 0.0
    finally:
        cr._RM_CACHE.clear()


def test_sft_rows_train_exactly_the_completion_under_trls_collator(standin_dir, tiny_model_dirs):
    """With the processor, TRL's VLM collator puts the loss on exactly format_target(...) + end of turn, for the
    Thinking template (whose rendering of a conversational assistant turn would drop or rewrite the think block)."""
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from open_r1 import modeling

    processor = modeling.load_processor(str(tiny_model_dirs["qwen3_vl"]))
    assert cdata.generation_prompt_opens_think(processor)
    _, paths = standin_dir
    top = S.add_templated_thinking(cdata.top_k_rows(cdata.load_captions(paths["train"]), 1))
    rows = cdata.sft_rows(top, top_k=1, processor=processor)
    assert rows[0]["prompt"].endswith("<|im_start|>assistant\n<think>\n")
    collator = DataCollatorForVisionLanguageModeling(processor, completion_only_loss=True)
    batch = collator([dict(rows[i]) for i in range(2)])
    for i in range(2):
        trained = batch["input_ids"][i][batch["labels"][i] != -100]
        text = processor.tokenizer.decode(trained)
        expected = P.format_target(top[i]["thinking"], top[i]["caption"])
        assert text == expected + "<|im_end|>\n"
        assert P.parse_details(text).caption == top[i]["caption"]
    assert "pixel_values" in batch
    # the pre-training corpus takes the same path; a backbone template without <think> gets no think prefix
    pre = S.pretrain_rows(cdata.load_captions(paths["train"]), per_contest=1, processor=processor)
    assert all(c.endswith("<|im_end|>\n") for c in pre["completion"])
    for kind, completion in zip(pre["kind"], pre["completion"]):
        if kind == "fluency":
            assert P.parse_details(completion).caption is not None
        else:
            assert completion.startswith("</think>\n\n")
    plain = modeling.load_processor(str(tiny_model_dirs["qwen2_5_vl"]))
    pre = S.pretrain_rows(cdata.load_captions(paths["train"]), per_contest=1, processor=plain)
    assert not any("think>" in c for c in pre["completion"])
    assert cdata.sft_rows(top, top_k=1, processor=plain)[0]["completion"].startswith("<think>\n")


def test_the_sft_stage_trains_on_text_rows_rendered_by_the_bases_template(
    standin_dir, tiny_model_dirs, tmp_path, monkeypatch
):
    """The stage renders its rows with the base policy's processor (as the test above checks the loss): a Thinking
    template rewrites a conversational think block, so conversational rows would not train on what is generated.
    The stage is a function of its own section and its inputs (the paths, the seed), no recipe."""
    from types import SimpleNamespace

    from open_r1 import sft
    from open_r1.tasks.captioning import stage_sft

    _, paths = standin_dir
    traces = tmp_path / "traces"
    S.add_templated_thinking(cdata.top_k_rows(cdata.load_captions(paths["train"]), 2)).save_to_disk(str(traces))
    seen = {}
    monkeypatch.setattr(
        sft, "train_sft", lambda rows, out, settings, **kw: seen.update(rows=rows, settings=settings) or {}
    )
    chain = SimpleNamespace(
        policy_base=str(tiny_model_dirs["qwen3_vl"]), traces=str(traces), policy_sft=str(tmp_path / "sft")
    )
    stage_sft.run(stage_sft.Config(learning_rate=3e-4), chain, 5)
    rows, settings = seen["rows"], seen["settings"]
    assert settings.seed == 5 and settings.learning_rate == 3e-4  # the seed given, the section's own settings
    assert len(rows) > 0 and all(p.endswith("<|im_start|>assistant\n<think>\n") for p in rows["prompt"])
    assert all(c.endswith("<|im_end|>\n") for c in rows["completion"])


def test_filter_captions_and_the_humor_r1_names(tmp_path):
    rows = make_rows(
        [{"contest": 1, "caption": f"a{i}", "mean": 1.0, "votes": 10 + i} for i in range(3)]
        + [{"contest": 2, "caption": f"b{i}", "mean": 1.0, "votes": 5 + 5 * i} for i in range(3)]
    )
    kept = cdata.filter_captions(rows, min_votes=10, min_captions=3)
    assert set(kept["contest"]) == {1} and len(kept) == 3  # contest 2 has only 2 captions with >= 10 votes
    assert len(cdata.filter_captions(rows, min_votes=10, min_captions=2)) == 5
    with pytest.raises(DataError):
        cdata.filter_captions(rows, min_votes=100)
    rows.rename_columns({"scene": "canny", "contest": "contest_number"}).save_to_disk(str(tmp_path / "real"))
    with pytest.raises(DataError, match="lacks column"):  # humor-r1's names: open-r1-caption-prepare --hub renames
        cdata.load_captions(tmp_path / "real")


def test_evaluate_cli_from_records(tmp_path):
    for name, records in (("base", BASELINE), ("grpo", POLICY)):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    out = tmp_path / "report"
    assert (
        ev.main(
            [
                "--records",
                f"base={tmp_path / 'base.jsonl'}",
                f"grpo={tmp_path / 'grpo.jsonl'}",
                "--baseline",
                "base",
                "--out",
                str(out),
                "--n-boot",
                "200",
            ]
        )
        == 0
    )
    with open(out / "bon_eval.json") as f:
        report = json.load(f)
    assert report["policies"]["grpo"]["fail_as_zero"] == pytest.approx(0.40)
    assert ev.main(["--records", "nonsense", "--out", str(out)]) == 2
    assert ev.main(["--records", "base=", "--out", str(out)]) == 2


def test_evaluate_cli_reports_again_from_the_eval_stages_samples(tmp_path, capsys):
    """The eval stage's samples.jsonl (every policy's records, each naming its policy) gives the report that the
    per-policy files give, without sampling again; a record without its policy is one error."""
    by_policy = {"base": BASELINE, "grpo": POLICY}
    stage = ev.write_report(ev.evaluate_records(by_policy, "base", 200, 0), str(tmp_path / "eval_test"), by_policy)
    argv = ["--baseline", "base", "--n-boot", "200", "--out"]
    assert ev.main(["--records", stage["samples"], *argv, str(tmp_path / "again")]) == 0
    for name, records in by_policy.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    per_policy = [f"{name}={tmp_path / name}.jsonl" for name in by_policy]
    assert ev.main(["--records", *per_policy, *argv, str(tmp_path / "files")]) == 0
    again, files = (json.loads((tmp_path / d / "bon_eval.json").read_text()) for d in ("again", "files"))
    assert again == files and set(again["policies"]) == {"base", "grpo"}
    capsys.readouterr()
    assert ev.main(["--records", str(tmp_path / "base.jsonl"), "--out", str(tmp_path / "x")]) == 2
    assert "record 1 names no policy; pass NAME=PATH per policy" in capsys.readouterr().err


def test_standin_has_no_text_only_leaks_from_size_or_other_renderers_puns():
    """The odd one is never marked by a word alone: size is no odd dimension (the odd one could only be 'large'),
    and an absent pun is a value this renderer can draw (a bus pun on a CLEVR scene is absent by the text alone)."""
    import numpy as np

    from standin.captioning import cartoons as standin

    assert "size" not in standin.ODD_DIMENSIONS["clevr"]
    meta = {
        "renderer": "clevr",
        "dimension": "color",
        "odd_index": 0,
        "odd_value": "blue",
        "majority_value": "red",
        "objects": [{"shape": "cube", "color": "blue", "size": "small"}]
        + [{"shape": "cube", "color": "red", "size": "large"}] * 3,
    }
    captions = standin.candidate_captions(np.random.default_rng(0), meta, 24)
    own = set(standin.renderer_values("clevr"))
    for c in captions:
        puns, _ = standin._caption_puns(c["caption"].lower())
        assert set(puns) <= own, (c, puns)


def test_rate_captions_simulates_readers_for_new_captions_only(standin_dir):
    """A ratings round on a policy's captions: new rows in the dataset's columns, rated as the candidates were
    (simulate_votes on the oracle), known / repeated captions and unknown contests skipped and counted."""
    _, paths = standin_dir
    train = cdata.load_captions(paths["train"])
    contest, known = train[0]["contest"], train[0]["caption"]
    meta = json.loads(train[0]["scene_meta"])
    new = f"Nobody tell {S.odd_object_phrase(meta)} it was adopted."
    samples = [
        {"contest": contest, "caption": known},
        {"contest": contest, "caption": new},
        {"contest": contest, "caption": f" {new} "},
        {"contest": -1, "caption": "x"},
    ]
    rated, counts = S.rate_captions(train, samples, seed=3)
    assert counts == {"samples": 4, "rated": 1, "known_caption": 2, "unknown_contest": 1}
    assert rated.column_names == train.column_names and len(rated) == 1
    row = rated[0]
    assert row["caption"] == new and row["contest"] == contest and row["scene_meta"] == train[0]["scene_meta"]
    assert row["oracle"] == pytest.approx(S.oracle_score(new, meta))
    expected = S.simulate_votes(np.random.default_rng(3), S.oracle_score(new, meta), S.StandinConfig())
    assert {k: row[k] for k in ("mean", "precision", "votes")} == pytest.approx(expected)
    assert row["image"].size == train[0]["image"].size
    # without the oracle column (real data has none) the rows carry no oracle either
    plain = cdata.load_captions(paths["train"]).remove_columns(["oracle"])
    assert "oracle" not in S.rate_captions(plain, samples)[0].column_names
    with pytest.raises(DataError, match="real raters"):
        S.rate_captions(plain.remove_columns(["scene_meta"]), samples)


def test_ratings_stage_writes_a_split_the_rm_trains_on(standin_dir, tiny_model_dirs, tmp_path, monkeypatch):
    """stage_ratings: the policy's parsed samples are rated and saved beside the training contests;
    rm.train_split=train_rated makes the RM's pairs come from it (a missing split: one clear error)."""
    import shutil

    import open_r1.generation as generation
    from open_r1.errors import RecipeError
    from standin.captioning import demo

    _, paths = standin_dir
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(
        f"name: t\nwork_dir: {tmp_path / 'work'}\nseed: 0\neval: {{n: 2, max_new_tokens: 8}}\n"
        "ratings: {n: 2}\nrm: {k: 1.0, cap_per_contest: 50}\n"
    )
    recipe = load(recipe_path)
    where = recipe.paths
    shutil.copytree(paths["train"], where.split("train"))
    shutil.copytree(tiny_model_dirs["qwen3_vl"], where.policy_sft)
    train = cdata.load_captions(where.split("train"))
    metas = {r["contest"]: json.loads(r["scene_meta"]) for r in train.select_columns(["contest", "scene_meta"])}
    captions = {
        c: f"Nobody tell {S.odd_object_phrase(m)} it was adopted, talk about a twist." for c, m in metas.items()
    }
    prompts_seen = []

    def fake_generate(model, processor, prompts, images, max_new_tokens, **kwargs):
        prompts_seen.extend(prompts)
        return ([P.format_target("odd.", "placeholder") for _ in prompts], [4] * len(prompts), [False] * len(prompts))

    monkeypatch.setattr(generation, "generate_texts", fake_generate)
    # each contest's samples carry that contest's caption (the fake cannot see which prompt is which contest)
    monkeypatch.setattr(ev, "evaluate_policy", _wrap_contest_captions(ev.evaluate_policy, captions))
    with pytest.raises(RecipeError, match="train_split"):
        training_pairs(load(recipe_path, ["rm.train_split=train_rated"]))
    out = tmp_path / "rated.json"
    assert demo.main(["--config", str(recipe_path), "--stages", "ratings", "--job-result", str(out)]) == 0
    summary = json.loads(out.read_text())
    contests = len(metas)
    assert len(prompts_seen) == 2 * contests and summary["samples"] == 2 * contests
    assert summary["counts"]["rated"] == contests and summary["counts"]["known_caption"] == contests  # 2nd repeats
    assert summary["rows"] == len(train) + contests and summary["pairs_with_a_rated_caption"] > 0
    pairs = training_pairs(load(recipe_path, ["rm.train_split=train_rated"]))
    assert any(c in captions.values() for c in [*pairs["chosen"], *pairs["rejected"]])
    # the summary counts the pairs the RM trains on (same rule, cap and seed), one rated caption per contest here
    rated_pairs = sum(
        a in captions.values() or b in captions.values() for a, b in zip(pairs["chosen"], pairs["rejected"])
    )
    assert summary["pairs"] == len(pairs) and summary["pairs_with_a_rated_caption"] == rated_pairs
    assert summary["pairs_of_two_rated_captions"] == 0
    plain = training_pairs(recipe)
    assert not any(c in captions.values() for c in [*plain["chosen"], *plain["rejected"]])


def _wrap_contest_captions(evaluate_policy, captions):
    def wrapped(*args, **kwargs):
        records = evaluate_policy(*args, **kwargs)
        for r in records:
            r["caption"] = captions[r["contest"]]
        return records

    return wrapped


def _rm_recipe(tmp_path, paths, rm: str, seed: int = 0, splits=("train",), name: str = "recipe.yaml"):
    """A recipe whose ``rm`` section is `rm` (YAML flow keys), with the stand-in fixture's `splits` in its work dir."""
    import os
    import shutil

    recipe_path = tmp_path / name
    recipe_path.write_text(f"name: t\nwork_dir: {tmp_path / 'work'}\nseed: {seed}\nrm: {{{rm}}}\n")
    recipe = load(recipe_path)
    for split in splits:
        if not os.path.isdir(recipe.paths.split(split)):
            shutil.copytree(paths[split], recipe.paths.split(split))
    return recipe


def load(path, overrides=()):
    """The recipe at `path` parsed for the stand-in demo's stages."""
    from standin.captioning import demo

    return demo.load_recipe(str(path), list(overrides))


def pair_rows(pairs, blind: bool = False) -> list[dict]:
    """RM pair rows ({image, chosen, rejected, group}) from ``preference_pairs`` output: the reference
    `stage_rm.training_pair_rows` (rows from the pairs' indices) is tested against."""
    rows = []
    # one Arrow -> Python conversion; row-by-row access cost ~40 % of this function
    records = pairs.remove_columns(["image"]).to_list()
    first: dict = {}
    for i, record in enumerate(records):
        first.setdefault(record["contest"], i)
    images = stage_rm.contest_images(pairs, first, blind)
    for record in records:
        desc = P.description_from_row(record)
        image = images[record["contest"]]
        rows.append(
            {
                "image": image,
                "chosen": P.rm_messages(desc, record["chosen"]),
                "rejected": P.rm_messages(desc, record["rejected"]),
                "group": record["contest"],
            }
        )
    return rows


def training_pairs(recipe):
    """The k-sigma preference pairs the RM trains on, from the split ``rm.train_split`` (default ``train``; e.g.
    ``train_rated``: the training contests with a round of ratings on a policy's samples added,
    ``stage_ratings``), capped per contest and shuffled with the recipe's seed (a pair dataset; the RM itself
    trains on `training_pair_rows`, the same pairs)."""
    cfg, paths, seed = recipe.args(stage_rm)
    max_pairs = cfg.max_pairs
    path = cconfig.check_inputs({"train": stage_rm.inputs(cfg, paths, seed)["train"]})["train"]
    pairs = preference_pairs(
        cdata.load_captions(path, check_images="none"), cfg.k, cfg.se_from, cfg.cap_per_contest, seed
    )
    if max_pairs:
        pairs = pairs.select(range(min(max_pairs, len(pairs))))
    return pairs


def test_rm_pair_rows_from_indices_equal_the_pair_datasets_rows(standin_dir, tmp_path):
    """The RM stage builds its rows from the pairs' row indices (no pair dataset with an image per pair); they
    must be `pair_rows(preference_pairs(...))`'s: the same pairs, order, messages, groups, images."""
    from open_r1.tasks.captioning import stage_rm

    _, paths = standin_dir
    recipe = _rm_recipe(
        tmp_path,
        paths,
        "k: 1.0, cap_per_contest: 40, max_pairs: 150, eval_cap_per_contest: 30",
        seed=3,
        splits=("train", "val"),
    )

    def comparable(rows):
        return [(r["group"], r["chosen"], r["rejected"], r["image"].tobytes()) for r in rows]

    for blind in (False, True):
        fast = stage_rm.training_pair_rows(*recipe.args(stage_rm), blind=blind)
        plain = pair_rows(training_pairs(recipe), blind=blind)
        assert len(fast) == 150 and len({r["group"] for r in fast}) > 1
        assert comparable(fast) == comparable(plain)
    held = stage_rm.index_pair_rows(*stage_rm.held_out_index(*recipe.args(stage_rm), "val"))
    dataset = cdata.load_captions(paths["val"], check_images="none")
    expected = pair_rows(preference_pairs(dataset, k=1.0, cap_per_contest=30, seed=3 + 7))
    assert held and comparable(held) == comparable(expected)


def test_image_negative_indices(standin_dir):
    """A top-k caption of one contest paired with the first row of another contest; seeded; clear errors."""
    _, paths = standin_dir
    dataset = cdata.load_captions(paths["train"])
    contests, means = dataset["contest"], dataset["mean"]
    index = cdata.image_negative_indices(dataset, 200, top_k=2, seed=5)
    assert index.shape == (200, 2)
    top2 = {
        c: set(sorted((r for r in range(len(contests)) if contests[r] == c), key=lambda r: -means[r])[:2])
        for c in set(contests)
    }
    firsts = {c: contests.index(c) for c in set(contests)}
    for own, other in index.tolist():
        assert own in top2[contests[own]]
        assert contests[other] != contests[own] and other == firsts[contests[other]]
    assert len({contests[own] for own, _ in index.tolist()}) == len(top2)  # 200 draws reach every contest
    assert len({contests[other] for _, other in index.tolist()}) == len(top2)
    assert (cdata.image_negative_indices(dataset, 200, top_k=2, seed=5) == index).all()
    assert not (cdata.image_negative_indices(dataset, 200, top_k=2, seed=6) == index).all()
    assert cdata.image_negative_indices(dataset, 0).shape == (0, 2)
    one_contest = dataset.select([r for r in range(len(contests)) if contests[r] == contests[0]])
    with pytest.raises(DataError, match="at least 2 contests"):
        cdata.image_negative_indices(one_contest, 3)
    with pytest.raises(DataError, match="integer >= 0"):
        cdata.image_negative_indices(dataset, -1)


def test_rm_image_swap_settings_are_checked(standin_dir, tmp_path):
    """A bad image-swap setting is refused before any stage runs."""
    from open_r1.errors import RecipeError

    _, paths = standin_dir
    for bad, key in (
        (", image_negative_top_k: 0", "rm.image_negative_top_k"),
        (", eval_image_swaps: 2.5", "rm.eval_image_swaps"),
    ):
        with pytest.raises(RecipeError, match=key):
            _rm_recipe(tmp_path, paths, f"k: 1.0{bad}", seed=3, name=f"recipe{len(bad)}.yaml")


def test_rm_image_swap_diagnostic(standin_dir, tmp_path):
    """Held-out scoring reports how often a top caption scores higher under its own cartoon than under another:
    exactly 0.5 for the blind control (both sides the one blank image), the requested number of captions, and
    nothing for a split of one contest or with `rm.eval_image_swaps: 0`."""
    import torch

    from open_r1 import reward_model as rm_lib
    from open_r1.tasks.captioning import stage_rm
    from open_r1.tiny_models import build_tiny

    _, paths = standin_dir
    recipe = _rm_recipe(
        tmp_path, paths, "k: 1.0, eval_cap_per_contest: 4, eval_image_swaps: 12, eval_batch_size: 8", splits=("val",)
    )
    torch.manual_seed(0)
    model = rm_lib.build_reward_model(
        str(build_tiny("qwen2_5_vl", tmp_path / "backbone")), min_pixels=3136, max_pixels=6272, dtype="float32"
    )
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0)  # scores that differ with the input
    blind = stage_rm.score_held_out(*recipe.args(stage_rm), model, blind=True, splits=["val"])["val"]["image_swap"]
    seeing = stage_rm.score_held_out(*recipe.args(stage_rm), model, blind=False, splits=["val"])["val"]["image_swap"]
    assert blind["accuracy"] == 0.5 and blind["n_pairs"] == seeing["n_pairs"] == 12
    assert seeing["accuracy"] != 0.5 and 0.0 <= seeing["ci_low"] <= seeing["accuracy"] <= seeing["ci_high"] <= 1.0
    recipe.section("rm").eval_image_swaps = 0
    assert (
        "image_swap" not in stage_rm.score_held_out(*recipe.args(stage_rm), model, blind=False, splits=["val"])["val"]
    )


def test_rm_held_out_pairs_on_data_without_the_oracle_column(standin_dir, tmp_path):
    """Real data has no oracle column: the held-out pairs are built all the same (the pair dataset path raised there,
    since held-out scoring always asked for the oracle)."""
    from open_r1.tasks.captioning import stage_rm

    _, paths = standin_dir
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(
        f"name: t\nwork_dir: {tmp_path / 'work'}\nseed: 0\nrm: {{k: 1.0, eval_cap_per_contest: 30}}\n"
    )
    recipe = load(recipe_path)
    real_like = cdata.load_captions(paths["val"]).remove_columns(["oracle"])
    real_like.save_to_disk(recipe.paths.split("val"))
    held = stage_rm.index_pair_rows(*stage_rm.held_out_index(*recipe.args(stage_rm), "val"))
    assert held
    with_oracle = stage_rm.index_pair_rows(
        cdata.load_captions(paths["val"]), cdata.pair_indices(real_like, k=1.0, cap_per_contest=30, seed=7)
    )
    assert [(r["chosen"], r["rejected"]) for r in held] == [(r["chosen"], r["rejected"]) for r in with_oracle]


def test_eval_sampling_cuts_come_from_the_recipe_or_the_policy(standin_dir, tiny_model_dirs, fake_rm, monkeypatch):
    """eval.top_p / eval.top_k reach generate (and the ratings round, which samples the same way); left out, the
    policy's generation config decides; a bad value is one RecipeError before any stage runs."""
    import open_r1.generation as generation
    from open_r1 import modeling
    from open_r1.errors import RecipeError
    from open_r1.tasks.captioning import stage_eval

    seen = []

    def fake_generate(model, processor, prompts, images, max_new_tokens, **kwargs):
        seen.append(kwargs)
        return ["no format"] * len(prompts), [5] * len(prompts), [False] * len(prompts)

    monkeypatch.setattr(generation, "generate_texts", fake_generate)
    _, paths = standin_dir
    data = cdata.load_captions(paths["val"], check_images="none")
    processor = modeling.load_processor(str(tiny_model_dirs["qwen3_vl"]))
    for extra, expected in (([], {}), (["eval.top_p=1.0", "eval.top_k=0"], {"top_p": 1.0, "top_k": 0})):
        recipe = load("configs/captioning/standin_demo.yaml", extra)
        sampling = {**stage_eval.sampling_kwargs(recipe.section("eval"), recipe.seed), "n": 1, "max_cartoons": 1}
        ev.evaluate_policy(None, processor, data, fake_rm, **sampling)
        assert {k: seen[-1][k] for k in ("top_p", "top_k") if k in seen[-1]} == expected
    for bad in ("eval.top_p=0", "eval.top_p=1.5", "eval.top_k=-1", "eval.top_k=2.5", "eval.top_k=true"):
        with pytest.raises(RecipeError, match=bad.split("=")[0]):
            load("configs/captioning/standin_demo.yaml", [bad])
