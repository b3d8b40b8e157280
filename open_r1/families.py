"""The supported model families, one record each: everything family-specific (loading class, vision geometry, LoRA
targets, where the vision tower is, deepstack), read by loading, LoRA, ViT de-duplication, export and the tiny
builders instead of branching on model names. Module names as in transformers 5.24's modeling files; the language
model of all three is `model.language_model`, the vision tower `model.visual`.
"""

from dataclasses import dataclass

from open_r1.errors import ModelError

LANGUAGE_LORA_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


@dataclass(frozen=True)
class ModelFamily:
    model_type: str  # config.json's model_type
    name: str  # human name, for messages
    class_name: str  # the transformers class AutoModelForImageTextToText resolves to (and config.architectures[0])
    processor_class: str
    patch_size: int  # ViT patch edge, pixels
    merge_size: int  # patches merged per side into one language-model token
    language_lora_targets: str  # peft target_modules regex (full match on the module name)
    vision_lora_targets: str
    has_deepstack: bool  # the tower returns deepstack_features that must follow pooler_output
    vision_attr: str = "visual"  # attribute of the inner model (model.model.<attr>) holding the vision tower
    example_checkpoint: str = ""

    @property
    def pixels_per_token(self) -> int:
        """Image area (pixels) behind one merged vision token: (patch x merge)^2."""
        return (self.patch_size * self.merge_size) ** 2

    def lora_targets(self, vision: bool) -> str:
        if not vision:
            return self.language_lora_targets
        return f"({self.language_lora_targets})|({self.vision_lora_targets})"

    def model_class(self):
        import transformers

        return getattr(transformers, self.class_name)


FAMILIES: dict[str, ModelFamily] = {
    family.model_type: family
    for family in (
        ModelFamily(
            model_type="qwen2_vl",
            name="Qwen2-VL",
            class_name="Qwen2VLForConditionalGeneration",
            processor_class="Qwen2VLProcessor",
            patch_size=14,
            merge_size=2,
            language_lora_targets=LANGUAGE_LORA_TARGETS,
            vision_lora_targets=r".*visual\.blocks\.\d+\.(attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)",
            has_deepstack=False,
            example_checkpoint="Qwen/Qwen2-VL-2B-Instruct",
        ),
        ModelFamily(
            model_type="qwen2_5_vl",
            name="Qwen2.5-VL",
            class_name="Qwen2_5_VLForConditionalGeneration",
            processor_class="Qwen2_5_VLProcessor",
            patch_size=14,
            merge_size=2,
            language_lora_targets=LANGUAGE_LORA_TARGETS,
            vision_lora_targets=(
                r".*visual\.blocks\.\d+\.(attn\.qkv|attn\.proj|mlp\.gate_proj|mlp\.up_proj|mlp\.down_proj)"
            ),
            has_deepstack=False,
            example_checkpoint="Qwen/Qwen2.5-VL-3B-Instruct",
        ),
        ModelFamily(
            model_type="qwen3_vl",
            name="Qwen3-VL",
            class_name="Qwen3VLForConditionalGeneration",
            processor_class="Qwen3VLProcessor",
            patch_size=16,
            merge_size=2,
            language_lora_targets=LANGUAGE_LORA_TARGETS,
            vision_lora_targets=r".*visual\.blocks\.\d+\.(attn\.qkv|attn\.proj|mlp\.linear_fc1|mlp\.linear_fc2)",
            has_deepstack=True,
            example_checkpoint="Qwen/Qwen3-VL-2B-Thinking",
        ),
    )
}
SUPPORTED = tuple(FAMILIES)


def get_family(model_type: str | None, where: str = "this model") -> ModelFamily:
    """The family record of a config.json `model_type`; a ModelError naming the supported ones otherwise."""
    family = FAMILIES.get(model_type or "")
    if family is None:
        supported = ", ".join(f"'{f.model_type}' ({f.class_name})" for f in FAMILIES.values())
        raise ModelError(
            f"{where} is a {model_type!r} model; supported model families are {supported}. Point to a checkpoint "
            "of one of them (e.g. " + ", ".join(f.example_checkpoint for f in FAMILIES.values()) + ")"
        )
    return family


def base_model(model):
    """The transformers model under a peft / DDP wrapper."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return getattr(model, "module", model) if not hasattr(model, "config") else model


def family_of(model_or_config) -> ModelFamily:
    """The family of a loaded model (bare or wrapped in peft) or of a config."""
    config = getattr(base_model(model_or_config), "config", model_or_config)
    return get_family(getattr(config, "model_type", None), where=type(model_or_config).__name__)


def vision_tower(model):
    """The ViT module of a supported model (bare, wrapped in peft, or the inner *VLModel), or None."""
    model = base_model(model)
    config = getattr(model, "config", None)
    family = FAMILIES.get(getattr(config, "model_type", "") or "")
    attr = family.vision_attr if family is not None else "visual"
    inner = getattr(model, "model", model)
    return getattr(inner, attr, None) or getattr(model, attr, None)
