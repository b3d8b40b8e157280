"""Counting that generalizes: the grader protocol, rewards, data validation, evaluation and the scene renderer."""

from dataclasses import dataclass

from open_r1.errors import help_field


@dataclass
class CountingSettings:
    """The counting task's own recipe keys, parsed by `open_r1.grpo` beside the engine's
    (`open_r1.tasks.TASK_SETTINGS`)."""

    prompt_templates: list[str] = help_field(
        ["train:0.5", "eval:0.5"],
        "Template mixing: 'name:weight' entries, names from open_r1.tasks.counting.protocol.TEMPLATES.",
    )
    columns: str | None = help_field(
        None,
        "Column names of a data set in another layout, e.g. 'image=img,question=q,answer=count' "
        "(recognised without it: image/problem/solution, and R1-V's eval jsonl image_path/question/ground_truth).",
    )
    image_root: str | None = help_field(
        None,
        "Folder that relative image paths of a .jsonl/.json set start from (R1-V's ./images/x.png); without it: "
        "the current directory.",
    )
