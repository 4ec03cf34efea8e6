"""Stage `evaluate`: val loss + a multiple-choice task (HellaSwag or cloze) + samples -> metrics/.

`eval.model` is `checkpoint` (this run's model/ folder) or any other model spec (gptcore.model.load: OpenAI weights
`gpt2`, ..., a Hugging Face GPT-2 folder, a checkpoint file), so the OpenAI baseline is measured by this same code on
this same data.
"""
from __future__ import annotations

from pathlib import Path

from gptcore.eval import cloze
from gptcore import distributed
from gptcore.eval import val_loss as evaluation
from gptcore.eval import harness, hellaswag
from gptcore.atomic import write_json
from gptcore.eval.multichoice import score_examples, write_predictions
from gptcore.eval.sampling import sample, tokenizer_for
from gptcore.data.tokenizers import load_tokenizer
from gptcore.model.load import load_model
from gptcore.precision import resolve_dtype
from gptcore.data import shards
from gptcore.eval.params import EVAL
from gptcore.params import check_val_tokens
from gptcore.process import reading, stage_lifetime
from stages.common import load_params, user_errors

SHARDS = Path("data/shards")
MODEL = Path("model")
OUT = Path("metrics")


def main() -> None:
    """Score eval.model on the val shards and the task; rank 0 writes metrics/eval.json, predictions, samples."""
    with user_errors("evaluate"):
        # every check on the user's input (params, data, model, task file) before the val-loss pass
        p = load_params(EVAL)
        env = distributed.setup(p["device"], key="eval.device")
        # held until the process ends: no tokenize swaps the shards meanwhile
        shards_lock = reading(SHARDS, "evaluate").acquire()  # noqa: F841
        tok = load_tokenizer(SHARDS)
        # lm-eval task data first: data that cannot be reached stops the stage before any model is loaded
        lm_tasks = harness.load_tasks(p["lm_eval_tasks"], p["lm_eval_include"]) if p["lm_eval_tasks"] else None
        model_spec = str(MODEL) if p["model"] == "checkpoint" else p["model"]
        model = load_model(model_spec)
        model_tok = tokenizer_for(model_spec, model)
        evaluation.check_same_tokenizer(model_tok, tok, model_spec, SHARDS)
        block = model.config.block_size
        val_split = sum(len(shards.load_tokens(path)) for path in shards.open_split(SHARDS, "val"))
        check_val_tokens("eval.val_tokens", p["val_tokens"], block, val_split)
        val_tokens = evaluation.val_stream(SHARDS, p["val_tokens"], tok.vocab_size)
        if p["task"] == "hellaswag":
            path = hellaswag.fetch_hellaswag("data/hellaswag", path=p["hellaswag_path"], progress=env.is_main,
                                             key="eval.hellaswag_path")
            examples = hellaswag.load_hellaswag(path, tok, limit=p["max_examples"])
        else:  # cloze (the schema allows nothing else)
            examples = cloze.build_cloze(val_tokens[:p["val_tokens"]], tok.eot, p["cloze_examples"],
                                         p["cloze_context"], p["cloze_ending"], p["seed"], key="eval.cloze_examples")
    model.to(env.device).eval()
    dtype = resolve_dtype(p["dtype"], env.device)
    loss = evaluation.val_loss(model, val_tokens, block, p["batch_size"], env.device, dtype, env.rank,
                               env.world_size, progress=env.is_main)
    bpc = evaluation.bits_per_char(loss, val_tokens, tok)  # comparable across tokenizers, unlike val_loss
    result = score_examples(model, examples, device=env.device, batch_size=p["batch_size"], dtype=dtype,
                            progress=env.is_main)

    if env.is_main:
        texts = sample(model, tok, p["sample_prompt"], p["samples"], p["sample_tokens"], p["temperature"],
                       p["top_k"], p["seed"], env.device, dtype) if p["samples"] else []
        lm_eval, seconds = harness.score_tasks(model, tok, lm_tasks, p["lm_eval_fewshot"], p["lm_eval_limit"],
                                               device=env.device, dtype=dtype, batch_size=p["batch_size"]) \
            if lm_tasks else ({}, {})
        write_predictions(OUT / "predictions.jsonl", result)
        evaluation.write_samples(OUT / "samples.txt", p["sample_prompt"], texts, model_spec)
        metrics = {"eval": {"val_loss": loss, "bits_per_char": bpc},
                   p["task"]: {"acc": result.acc, "acc_norm": result.acc_norm, "count": result.count}}
        if lm_eval:
            metrics["lm_eval"] = lm_eval  # lm-eval's own task and metric names, apart from eval.task's
        write_json(OUT / "eval.json", metrics)
        print(f"[evaluate] {model_spec}: val_loss {loss:.4f} ({bpc:.4f} bits/char), {p['task']} acc {result.acc:.4f} "
              f"acc_norm {result.acc_norm:.4f} ({result.count} examples)", flush=True)
        for line in harness.describe(lm_eval, seconds):
            print(f"[evaluate] {line}", flush=True)
    distributed.teardown()


if __name__ == "__main__":
    with stage_lifetime("evaluate"):  # dies with dvc; Ctrl-C / SIGTERM: one line
        main()
