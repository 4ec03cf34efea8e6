"""Stage `evaluate`: val loss + a multiple-choice task (HellaSwag or cloze) + samples -> metrics/.

`eval.model` is `checkpoint` (this run's model/ folder) or any other model spec (gptcore.model.load: OpenAI weights
`gpt2`, ..., a Hugging Face GPT-2 folder, a checkpoint file), so the OpenAI baseline is measured by this same code on
this same data.
"""
from __future__ import annotations

from pathlib import Path

from gptcore import distributed
from gptcore.atomic import write_json
from gptcore.data import shards
from gptcore.data.tokenizers import load_tokenizer
from gptcore.eval import harness
from gptcore.eval.cloze import build_cloze
from gptcore.eval.hellaswag import hellaswag_examples
from gptcore.eval.measured import measured_on
from gptcore.eval.multichoice import score_examples, write_predictions
from gptcore.eval.params import EVAL
from gptcore.eval.sampling import model_for_shards, sample
from gptcore.eval.val_loss import bits_per_char, val_loss, val_stream, write_samples
from gptcore.params import check_val_tokens
from gptcore.precision import resolve_dtype
from gptcore.process import reading, stage_lifetime
from stages.common import load_params, user_errors

SHARDS, MODEL, OUT = Path("data/shards"), Path("model"), Path("metrics")


def main() -> None:
    """Score eval.model on the val shards and the task; rank 0 writes metrics/eval.json, predictions, samples."""
    with user_errors("evaluate"):
        # every check on the user's input (params, data, model, task file) before the val-loss pass
        p = load_params(EVAL)
        env = distributed.setup(p["device"], key="eval.device")
        shards_lock = reading(SHARDS, "evaluate").acquire()  # noqa: F841  (no tokenize swaps the shards meanwhile)
        tok = load_tokenizer(SHARDS)
        # lm-eval task data first: data that cannot be reached stops the stage before any model is loaded
        lm_tasks = harness.load_tasks(p["lm_eval_tasks"], p["lm_eval_include"], p["lm_eval_fewshot"],
                                      echo=(lambda line: print(f"[evaluate] {line}", flush=True)) if env.is_main
                                      else None) if p["lm_eval_tasks"] else None
        spec = str(MODEL) if p["model"] == "checkpoint" else p["model"]
        model = model_for_shards(spec, tok, SHARDS)
        check_val_tokens("eval.val_tokens", p["val_tokens"], model.config.block_size,
                         shards.split_tokens(SHARDS, "val"))
        tokens = val_stream(SHARDS, p["val_tokens"], tok.vocab_size)
        if p["task"] == "hellaswag":
            examples = hellaswag_examples(tok, p["hellaswag_path"], p["max_examples"], "eval.hellaswag_path",
                                          progress=env.is_main, block_size=model.config.block_size)
        else:  # cloze (the schema allows nothing else)
            examples = build_cloze(tokens[:p["val_tokens"]], tok.eot, p["cloze_examples"], p["cloze_context"],
                                   p["cloze_ending"], p["seed"], key="eval.cloze_examples")
        record = measured_on(p, SHARDS, lm_tasks)  # what the figures are measured on, read before any pass
    model.to(env.device).eval()
    dtype = resolve_dtype(p["dtype"], env.device)
    loss = val_loss(model, tokens, model.config.block_size, p["batch_size"], env.device, dtype, env.rank,
                    env.world_size, progress=env.is_main)
    bpc = bits_per_char(loss, tokens, tok)  # comparable across tokenizers, unlike val_loss
    result = score_examples(model, examples, device=env.device, batch_size=p["batch_size"], dtype=dtype,
                            progress=env.is_main)
    if env.is_main:
        texts = sample(model, tok, p["sample_prompt"], p["samples"], p["sample_tokens"], p["temperature"],
                       p["top_k"], p["seed"], env.device, dtype) if p["samples"] else []
        lm_eval, seconds = harness.score_tasks(model, tok, lm_tasks, p["lm_eval_fewshot"], p["lm_eval_limit"],
                                               device=env.device, dtype=dtype, batch_size=p["batch_size"]) \
            if lm_tasks else ({}, {})
        write_predictions(OUT / "predictions.jsonl", result)
        write_samples(OUT / "samples.txt", p["sample_prompt"], texts, spec)
        metrics = {"eval": {"val_loss": loss, "bits_per_char": bpc},
                   p["task"]: {"acc": result.acc, "acc_norm": result.acc_norm, "count": result.count}}
        if lm_eval:
            metrics["lm_eval"] = lm_eval  # lm-eval's own task and metric names, apart from eval.task's
        write_json(OUT / "measured_on.json", record)
        write_json(OUT / "eval.json", metrics)
        print(f"[evaluate] {spec}: val_loss {loss:.4f} ({bpc:.4f} bits/char), {p['task']} acc {result.acc:.4f} "
              f"acc_norm {result.acc_norm:.4f} ({result.count} examples)", flush=True)
        for line in harness.describe(lm_eval, seconds):
            print(f"[evaluate] {line}", flush=True)
    distributed.teardown()


if __name__ == "__main__":
    with stage_lifetime("evaluate"):  # dies with dvc; Ctrl-C / SIGTERM: one line
        main()
