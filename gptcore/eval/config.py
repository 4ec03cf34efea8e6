"""The schema of params.yaml's `eval:` section."""
from __future__ import annotations

from gptcore.device import DEVICES, DTYPES
from gptcore.params import REQUIRED, Param, Section

TASKS = ("hellaswag", "cloze")
# conf/lm_eval or a folder below it, written relative to the project, with no "." or ".." step out of it
INCLUDE_PATTERN = r"conf/lm_eval(/(?!\.\.?(/|$))[^/]+)*/?"

EVAL = Section("eval", {
    "model": Param(str, "checkpoint", "checkpoint (this run's model/) | gpt2 | path to a Hugging Face GPT-2 folder"),
    "task": Param(str, REQUIRED, "the multiple-choice task", choices=TASKS),
    "hellaswag_path": Param(str, None, "a local HellaSwag val jsonl (null: download it)", also=(None,)),
    "max_examples": Param(int, None, "score the first this many HellaSwag examples (null: all)", min=1, also=(None,)),
    "device": Param(str, "auto", "auto (cuda, else mps, else cpu) | cpu | cuda | cuda:N | mps",
                    pattern=DEVICES, what="auto, cpu, cuda, cuda:N or mps"),
    "dtype": Param(str, "bfloat16", "autocast precision (float32 turns it off)", choices=tuple(sorted(DTYPES))),
    "batch_size": Param(int, 32, "sequences per forward pass", min=1),
    "val_tokens": Param(int, REQUIRED, "val loss over the first val_tokens tokens of the val split", min=1),
    "cloze_examples": Param(int, 500, "cloze questions cut from the val split", min=1),
    "cloze_context": Param(int, 64, "context tokens of a cloze question", min=1),
    "cloze_ending": Param(int, 16, "tokens of each cloze ending", min=1),
    "seed": Param(int, 1337, "seed of the cloze questions and the samples", min=0),
    "samples": Param(int, 3, "text samples written to metrics/samples.txt", min=0),
    "sample_prompt": Param(str, REQUIRED, "prompt of those samples"),
    "sample_tokens": Param(int, 64, "tokens per sample", min=1),
    "temperature": Param(float, 0.8, "sampling temperature", above=0.0),
    "top_k": Param(int, 200, "sample from the k most likely tokens (null: all)", min=1, also=(None,)),
    "lm_eval_tasks": Param(list, [], "lm-evaluation-harness tasks scored on the model, e.g. [hellaswag, lambada_openai] "
                                     "([]: none)"),
    "lm_eval_fewshot": Param(int, 0, "few-shot examples before each lm-eval question", min=0),
    "lm_eval_limit": Param(int, None, "score the first this many examples of each lm-eval task (null: all)", min=1,
                           also=(None,)),
    # under conf/lm_eval/, which dvc.yaml lists among evaluate's deps: a changed YAML or !function file reruns it
    "lm_eval_include": Param(str, None, "a folder of your own lm-eval task YAMLs under conf/lm_eval/ (null: "
                                        "lm-eval's tasks only)", also=(None,), pattern=INCLUDE_PATTERN,
                             what="a folder under conf/lm_eval/ (DVC tracks that folder for evaluate)"),
})

