"""Builds every request of an afkit export's lm-evaluation-harness tasks, without a model.

Usage: python check_lm_eval.py EXPORT_DIR   (run with EXPORT_DIR as the working directory's
parent or anywhere: the script changes into it, as the card's command runs from there)

Loads the tasks from EXPORT_DIR/lm_eval with the harness's own TaskManager, builds all requests
as `lm_eval` would before calling a model, and checks them against the exported files: four
log-likelihood requests per question of the evaluated split, in file order, with the SWAG-style
context (the startphrase) or the HellaSwag-style one ("activity_label: ctx"), each ending as the
continuation after a space, and the label as the target.
"""

import json
import os
import sys

from lm_eval.tasks import TaskManager, get_task_dict


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def expected_questions(split_stem, style):
    with open(os.path.join("jsonl", f"{split_stem}.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    out = []
    for r in rows:
        context = r["startphrase"] if style == "swag" else f"{r['activity_label']}: {r['ctx']}"
        out.append((context, r["endings"], r["label"]))
    return out


def check_task(task, style):
    split = "test" if task.has_test_docs() else "validation"
    stem = "test" if split == "test" else "val"
    questions = expected_questions(stem, style)
    task.build_all_requests(limit=None, rank=0, world_size=1)
    instances = sorted(task.instances, key=lambda i: (i.doc_id, i.idx))
    if len(instances) != 4 * len(questions):
        fail(f"{task.config.task}: {len(instances)} requests for {len(questions)} questions")
    for inst in instances:
        context, endings, label = questions[inst.doc_id]
        if inst.request_type != "loglikelihood":
            fail(f"{task.config.task}: a {inst.request_type} request")
        if inst.arguments != (context, " " + endings[inst.idx]):
            fail(f"{task.config.task} doc {inst.doc_id}: {inst.arguments!r}")
        if task.doc_to_target(inst.doc) != label:
            fail(f"{task.config.task} doc {inst.doc_id}: target {task.doc_to_target(inst.doc)!r}")
    print(f"ok {task.config.task}: {len(instances)} requests on {split}")


def main():
    os.chdir(sys.argv[1])
    manager = TaskManager(include_path="lm_eval", include_defaults=False)
    tasks = get_task_dict(["afkit_swag", "afkit_hellaswag"], manager)
    check_task(tasks["afkit_swag"], "swag")
    check_task(tasks["afkit_hellaswag"], "hellaswag")
    print("all requests built")


if __name__ == "__main__":
    main()
