"""Contracts of the private TRL / transformers / torch names that open_r1.compat relies on (one test per item).

Each test fails with the item's name when an upgrade moves what compat.py uses (the benches' own items:
experiments/bench/compat.py, `test_bench_item*`); a last test fails when a private library name is used in the package
or in experiments/ outside those two compat modules.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch
import trl
from trl import GRPOTrainer

from experiments.bench import compat as bench_compat
from open_r1 import compat

ROOT = Path(__file__).resolve().parents[1]


def _source(obj) -> str:
    return inspect.getsource(obj)


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _in_order(text: str, *pieces: str) -> bool:
    positions = [text.find(piece) for piece in pieces]
    return all(p >= 0 for p in positions) and positions == sorted(positions)


def test_trl_is_the_pinned_version():
    assert trl.__version__ == "1.16.0", "open_r1.compat was checked against TRL 1.16.0: re-check every item below"


# ---- 1. GRPORoundHooks ------------------------------------------------------------------------------------------
def test_item1_generate_and_score_completions_is_the_round_hook():
    assert _params(GRPOTrainer._generate_and_score_completions) == ["self", "inputs"]
    source = _source(GRPOTrainer._prepare_inputs)
    assert _params(GRPOTrainer._prepare_inputs) == ["self", "generation_batch"]
    # training: generate -> split images -> shuffle -> split into micro-batches -> buffer -> index by _step
    assert _in_order(
        source,
        "self._generate_and_score_completions(generation_batch)",
        "split_pixel_values_by_grid(",
        "shuffle_sequence_dict(",
        "split_tensor_dict(",
        "self._buffered_inputs = [unsplit_pixel_values_by_grid(",
        "self._buffered_inputs[self._step % self.args.steps_per_generation]",
    ), "GRPOTrainer._prepare_inputs changed: GRPORoundHooks.regroup_round relies on its order"
    # evaluation generates through the same hook
    assert source.count("self._generate_and_score_completions(") == 2


def test_item1_step_counter_and_buffer_live_where_compat_reads_them():
    assert "self._buffered_inputs = None" in _source(GRPOTrainer.__init__)
    assert "self._step = 0" in _source(GRPOTrainer.__init__)
    training_step = _source(GRPOTrainer.training_step)
    assert _in_order(
        training_step, "self._prepare_inputs" if "self._prepare_inputs" in training_step else "", "self._step += 1"
    ), "GRPOTrainer.training_step no longer advances _step after the micro-batch"


def test_item1_round_hooks_call_order_on_a_stand_in_trainer():
    """GRPORoundHooks on a stand-in base with TRL's buffering contract: hooks run in order, regrouping replaces the
    buffer and the returned micro-batch is the regrouped one at `_step`."""
    calls = []

    class Base:
        def __init__(self):
            self._buffered_inputs, self._step = None, 1
            self.args = type("Args", (), {"steps_per_generation": 2})()

        def _generate_and_score_completions(self, inputs):
            calls.append(("generate", list(inputs)))
            return {"rows": list(inputs)}

        def _prepare_inputs(self, generation_batch):
            out = self._generate_and_score_completions(generation_batch)
            self._buffered_inputs = [{"part": 0, **out}, {"part": 1, **out}]
            return self._buffered_inputs[self._step % self.args.steps_per_generation]

    class Hooked(compat.GRPORoundHooks, Base):
        def before_round(self, rows):
            calls.append(("before", list(rows)))
            return [r * 10 for r in rows]

        def after_round(self, rows, output):
            calls.append(("after", rows))
            return {**output, "after": True}

        def regroup_round(self, micro_batches):
            return [dict(m, regrouped=True) for m in reversed(micro_batches)]

    trainer = Hooked()
    out = trainer._prepare_inputs([1, 2])
    assert calls == [("before", [1, 2]), ("generate", [10, 20]), ("after", [10, 20])]
    assert out == {"part": 0, "rows": [10, 20], "after": True, "regrouped": True}
    assert trainer._buffered_inputs[1] is out  # _step 1 of the regrouped (reversed) buffer


# ---- 2. split helpers ---------------------------------------------------------------------------------------------
def test_item2_trl_split_helpers_round_trip():
    from trl.trainer import utils

    for name, params in (
        ("split_pixel_values_by_grid", ["batch"]),
        ("unsplit_pixel_values_by_grid", ["batch"]),
        ("split_tensor_dict", ["tensor_dict", "num_chunks"]),
    ):
        assert _params(getattr(utils, name))[: len(params)] == params, name
    grid = torch.tensor([[1, 2, 2], [1, 2, 4], [1, 2, 2], [1, 4, 2]])
    pixels = torch.arange(int(grid.prod(-1).sum()) * 3, dtype=torch.float32).reshape(-1, 3)
    batch = {
        "prompt_ids": torch.arange(4)[:, None],
        "pixel_values": pixels,
        "image_grid_thw": grid,
        "num_images": [1, 1, 1, 1],
        "num_items_in_batch": torch.tensor(7),
    }  # a tensor first, as in TRL
    per_image = compat.split_by_image(batch)
    assert [p.shape[0] for p in per_image["pixel_values"]] == [4, 8, 4, 8]
    chunks = compat.split_rows(per_image, 2)
    assert [c["prompt_ids"][:, 0].tolist() for c in chunks] == [[0, 1], [2, 3]]
    assert all(int(c["num_items_in_batch"]) == 7 for c in chunks)
    merged = [compat.unsplit_by_image(c) for c in chunks]
    assert torch.equal(torch.cat([m["pixel_values"] for m in merged]), pixels)
    assert torch.equal(torch.cat([m["image_grid_thw"] for m in merged]), grid)


# ---- 3. class swap on each family's vision tower -----------------------------------------------------------------
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_item3_vision_towers_take_a_mixin_class_swap(family):
    from open_r1.families import FAMILIES, vision_tower
    from open_r1.tiny_models import build_config
    from open_r1.vision_dedupe import DedupeVisionMixin

    config = build_config(family=family)
    with torch.device("meta"):
        model = FAMILIES[family].model_class()(config)
    visual = vision_tower(model)
    base = type(visual)
    assert "__slots__" not in vars(base)
    assert _params(base.forward)[:3] == ["self", "hidden_states", "grid_thw"], f"{base.__name__}.forward moved"
    assert hasattr(visual, "spatial_merge_size")
    keys = list(visual.state_dict())
    assert compat.subclass_instance(visual, DedupeVisionMixin, prefix="Dedupe")
    assert type(visual).__mro__[1:3] == (DedupeVisionMixin, base) and type(visual).__name__ == f"Dedupe{base.__name__}"
    assert list(visual.state_dict()) == keys and not compat.subclass_instance(visual, DedupeVisionMixin, "Dedupe")
    if FAMILIES[family].has_deepstack:  # the field DedupeVisionMixin expands
        from transformers.models.qwen3_vl.modeling_qwen3_vl import (
            BaseModelOutputWithDeepstackFeatures,
        )

        assert "deepstack_features" in BaseModelOutputWithDeepstackFeatures.__dataclass_fields__


# ---- 4. per-step metrics ------------------------------------------------------------------------------------------
def test_item4_metrics_store_is_a_dict_of_lists_flushed_by_log():
    init = _source(GRPOTrainer.__init__)
    assert re.search(r"self\._metrics = \{\s*\"train\": defaultdict\(list\),\s*\"eval\": defaultdict\(list\)", init)
    assert "self._metrics[mode]" in _source(GRPOTrainer.log)
    from collections import defaultdict

    trainer = type("T", (), {"_metrics": {"train": defaultdict(list), "eval": defaultdict(list)}})()
    assert compat.log_step_metrics(trainer, {"eval/val_accuracy": 50.0})
    assert trainer._metrics["train"]["eval/val_accuracy"] == [50.0]
    assert not compat.log_step_metrics(object(), {"x": 1.0})


def test_item4_public_log_metric_reaches_reward_functions():
    """Rewards log sub-scores through TRL's public `log_metric` reward kwarg (not through compat)."""
    assert 'reward_kwargs["log_metric"]' in _source(GRPOTrainer._calculate_rewards)


# ---- 5. scheduler last lr -----------------------------------------------------------------------------------------
def test_item5_scheduler_last_lr_is_what_get_last_lr_reports():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    compat.set_scheduler_last_lr(scheduler, [0.25])
    assert scheduler.get_last_lr() == [0.25]


# ---- 6. rollout generate hook -------------------------------------------------------------------------------------
def test_item6_generate_single_turn_calls_generate_on_the_unwrapped_model():
    if not hasattr(compat, "GRPOGenerateHook"):
        pytest.skip("no GRPOGenerateHook in this checkout")
    source = _source(GRPOTrainer._generate_single_turn)
    assert "unwrap_model_for_generation(" in source and "unwrapped_model.generate(" in source
    assert "generation_config=self.generation_config" in source
    assert {"use_vllm", "use_transformers_continuous_batching"} <= set(re.findall(r"self\.(use_\w+)", source))


# ---- 7. inductor re-record limit ----------------------------------------------------------------------------------
def test_item7_cudagraph_rerecord_limit_knob_exists():
    import torch._inductor.config as inductor_config

    previous = inductor_config.triton.cudagraph_unexpected_rerecord_limit
    try:
        compat.raise_cudagraph_rerecord_limit(12345)
        assert inductor_config.triton.cudagraph_unexpected_rerecord_limit == 12345
    finally:
        inductor_config.triton.cudagraph_unexpected_rerecord_limit = previous


def test_item8_attn_implementation_is_what_set_attn_implementation_sets_per_sub_config(tiny_model_dir):
    import transformers.models.qwen2_vl.modeling_qwen2_vl as qwen2_vl
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    vision, text = model.config.vision_config, model.config.get_text_config()
    assert compat.attn_implementation(vision) == compat.attn_implementation(text) == "sdpa"
    model.set_attn_implementation({"vision_config": "eager"})
    assert (compat.attn_implementation(vision), compat.attn_implementation(text)) == ("eager", "sdpa")
    assert compat.attn_implementation(None) is None
    # the attention layers look their function up by that attribute
    assert "self.config._attn_implementation" in _source(qwen2_vl.VisionAttention.forward)


def test_item9_set_vision_attn_implementation_sets_a_registered_flash_named_function_on_the_vision_tower_only(
    tiny_model_dir,
):
    from transformers import AttentionInterface, AutoModelForImageTextToText

    from open_r1.vision_attention import grouped_sdpa

    name = "open_r1_flash_contract_probe"  # "flash" in the name: what transformers 5.25's setter refuses
    AttentionInterface.register(name, grouped_sdpa)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    compat.set_vision_attn_implementation(model, name)
    vision, text = model.config.vision_config, model.config.get_text_config()
    assert (compat.attn_implementation(vision), compat.attn_implementation(text)) == (name, "sdpa")
    # the fallback sets one config object: every vision module must read that one
    visual = model.model.visual
    assert visual.config is vision
    assert all(m.config is vision for m in visual.modules() if hasattr(m, "config"))


# ---- 11. a model built whole while ZeRO-3 is configured ------------------------------------------------------------
def test_item11_built_whole_keeps_from_config_from_opening_zero_init(monkeypatch):
    """With ZeRO-3 configured, building Qwen2-VL by its constructor opens DeepSpeed's zero.Init through the
    sub-models' `_from_config` (the rollout copy came out partitioned on an H100); inside `built_whole` it does not,
    and the rollout copy of such a policy holds whole tensors."""
    import sys
    import types

    import transformers.modeling_utils as modeling_utils

    from open_r1 import tiny_models
    from open_r1.rollout_weights import RolloutWeights

    class Opened(Exception):
        pass

    def deepspeed_config():  # transformers reads it only to open zero.Init
        raise Opened

    policy = tiny_models.build_model(tiny_models.build_config(), seed=0)
    monkeypatch.setitem(sys.modules, "deepspeed", types.SimpleNamespace(zero=types.SimpleNamespace(Init=None)))
    monkeypatch.setattr(modeling_utils, "is_deepspeed_zero3_enabled", lambda: True)
    monkeypatch.setattr(modeling_utils, "deepspeed_config", deepspeed_config)
    with pytest.raises(Opened):
        type(policy)(policy.config)
    with compat.built_whole():
        type(policy)(policy.config)
    copy = RolloutWeights(policy).model
    assert all(p.shape == q.shape for p, q in zip(copy.parameters(), policy.parameters(), strict=True))


# ---- bench item 1. TRL's Triton choice -------------------------------------------------------------------------------
def test_bench_item1_use_triton_decides_completion_only_scoring():
    from trl.trainer import utils

    assert _params(utils._use_triton) == ["device"]
    cpu = torch.device("cpu")
    before = utils._use_triton(cpu)
    with bench_compat.completion_only_scoring():
        assert utils._use_triton(cpu) is True
    assert utils._use_triton(cpu) == before
    with bench_compat.completion_only_scoring(enabled=False):
        assert utils._use_triton(cpu) == before


# ---- bench item 2. torch.compile's per-phase times -------------------------------------------------------------------
def test_bench_item2_compile_time_report_names_dynamos_phases():
    import torch

    torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))
    report = bench_compat.compile_time_report()
    assert isinstance(report, str) and "_compile.compile_inner" in report


# ---- nothing private outside the compat modules ---------------------------------------------------------------------
LIBRARIES = ("torch", "trl", "transformers", "accelerate", "peft", "datasets", "safetensors", "deepspeed")


def private_library_uses(path: Path) -> list[str]:
    """`lib._private` attribute chains on names imported from LIBRARIES, imports of private modules
    (`trl.trainer.utils`, `torch._inductor`), and `super()._private` overrides of library methods."""
    tree = ast.parse(path.read_text(), filename=str(path))
    library_names = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    library_names.add((alias.asname or alias.name).split(".")[0])
                    if any(part.startswith("_") for part in alias.name.split(".")):
                        found.append(f"{path.name}:{node.lineno} import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            parts = node.module.split(".")
            if any(p.startswith("_") for p in parts) or node.module == "trl.trainer.utils":
                found.append(f"{path.name}:{node.lineno} from {node.module} import ...")
            for alias in node.names:
                library_names.add(alias.asname or alias.name)
                if alias.name.startswith("_"):
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in library_names:
                found.append(f"{path.name}:{node.lineno} {root.id}...{node.attr}")
            elif isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id == "super":
                found.append(f"{path.name}:{node.lineno} super().{node.attr}")
    return found


def test_item12_block_class_names_are_the_decoder_layer_and_vision_block(family):
    from transformers import AutoModelForImageTextToText

    from open_r1.tiny_models import build_config

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(build_config(family=family))
    names = compat.block_class_names(model)
    present = {type(module).__name__ for module in model.modules()}
    assert len(names) == 2 and names <= present
    assert sorted(n.endswith("DecoderLayer") + 2 * n.endswith("VisionBlock") for n in names) == [1, 2], "item 12"


def test_the_static_check_finds_private_uses(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import torch\nfrom trl.trainer.utils import split_tensor_dict\n"
        "class T:\n    def f(self):\n        return super()._prepare_inputs(1)\n"
        "torch._inductor.config.x = 1\n"
    )
    assert len(private_library_uses(sample)) == 3


def test_no_private_library_name_outside_compat():
    compat_modules = {ROOT / "open_r1" / "compat.py", ROOT / "experiments" / "bench" / "compat.py"}
    files = [
        p
        for folder in ("open_r1", "experiments")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p not in compat_modules
    ] + [ROOT / "selfcheck.py"]
    assert ROOT / "experiments" / "bench" / "bench.py" in files
    uses = [use for path in files for use in private_library_uses(path)]
    assert not uses, f"private TRL/transformers/torch names outside the two compat modules: {uses}"


# ---- 10. GRPO's rollout settings ------------------------------------------------------------------------------------
def test_item10_trl_keeps_its_rollout_settings_where_suppress_in_rollouts_writes_them():
    source = _source(GRPOTrainer.__init__)
    assert 'generation_kwargs["suppress_tokens"] = [model.config.image_token_id]' in source
    assert "self.generation_config = GenerationConfig(**generation_kwargs" in source
    assert "self.generation_kwargs = generation_kwargs" in source
    assert "generation_kwargs=self.generation_kwargs" in _source(GRPOTrainer._generate_single_turn)

    from transformers import GenerationConfig

    stand_in = type("Trainer", (), {})()
    stand_in.use_vllm, stand_in.generation_config = False, GenerationConfig(suppress_tokens=[9])
    stand_in.generation_kwargs = {"suppress_tokens": [9]}
    assert compat.suppress_in_rollouts(stand_in, [5, 9, 7])
    assert stand_in.generation_config.suppress_tokens == stand_in.generation_kwargs["suppress_tokens"] == [5, 7, 9]
    stand_in.use_vllm = True
    assert not compat.suppress_in_rollouts(stand_in, [1])
