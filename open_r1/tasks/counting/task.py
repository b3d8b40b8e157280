"""The counting task as the engine sees it: training prompts with template mixing, held-out sets scored with the
grader's protocol (accuracy %, keep-best by the OOD set)."""

from open_r1.checks import first_rows
from open_r1.tasks import Task, one_line
from open_r1.tasks.counting import data as data_lib
from open_r1.tasks.counting import evaluate as evaluate_lib
from open_r1.tasks.counting import protocol
from open_r1.tasks.counting.scenes.render import render_scene


class CountingTask(Task):
    name = "counting"
    metric = "accuracy"
    default_primary = "ood_val"
    default_secondary = "val"
    generate_hint = data_lib.GENERATE_HINT
    probe_question = "How many items are there in the image?"

    def train_dataset(self, script_args, training_args):
        dataset = self.load_split(script_args.dataset_name, script_args.dataset_train_split)
        dataset = first_rows(dataset, script_args.max_train_samples or None)
        data_lib.validate_counting_dataset(dataset, script_args.dataset_name, script_args.image_check_rows)
        templates = data_lib.TemplateMix.parse(self.settings.prompt_templates)
        return data_lib.to_grpo_dataset(dataset, templates, seed=training_args.seed)

    def load_split(self, path_or_name, split="train"):  # any layout, with the counting columns
        dataset = super().load_split(path_or_name, split)
        return data_lib.counting_columns(dataset, path_or_name, self.settings.columns, self.settings.image_root)

    def load_eval_set(self, path, limit=None):
        dataset = first_rows(data_lib.drop_non_counts(self.load_split(path), path)[0], limit)
        data_lib.validate_counting_dataset(dataset, path)
        return dataset

    def evaluate(self, model, processor, dataset, name, batch_size, limit=None, progress=False):
        return evaluate_lib.evaluate_dataset(
            model, processor, dataset, name=name, batch_size=batch_size, limit=limit, progress=progress
        )

    def report_from_records(self, name, records, seconds):
        return evaluate_lib.report_from_records(name, records, seconds)

    def training_meta(self):
        return {"prompt_templates": list(self.settings.prompt_templates)}

    def probe_image(self):  # a scene like the training data: a trained model answers it in the format
        return render_scene(0)[0]

    def probe(self, model, processor):
        texts, _, _ = evaluate_lib.generate_batch(model, processor, [self.probe_image()], [self.probe_question])
        if protocol.extract_answer(texts[0]) is None:
            return texts[0], f"the sample completion has no parseable <answer>N</answer>: {one_line(texts[0])}"
        return texts[0], None


TASK = CountingTask
