"""Stage `evaluate`: eval.model (model/ or any spec: OpenAI's baseline too) -> val loss, HellaSwag or cloze, samples."""
from __future__ import annotations

from pathlib import Path

from gptcore import device, distributed
from gptcore.atomic import write_json
from gptcore.data import shards, tokenizers
from gptcore.eval import cloze, harness, hellaswag, measured, sampling, scorer, val_loss
from gptcore.eval.config import EVAL
from gptcore.params import check_val_tokens
from stages.boundary import stage

# model/ is train's output, under train's lock on checkpoints/; metrics/'s lock covers evaluate's and compare's files
SHARDS, MODEL, TRAINED, OUT = Path("data/shards"), Path("model"), Path("checkpoints"), Path("metrics")


def main() -> None:
    """Score eval.model on the val shards and the task; rank 0 writes metrics/eval.json, predictions, samples."""
    with stage("evaluate", reads=[SHARDS, TRAINED], writes=[OUT]) as s:
        # every check of the user's input before any pass; lm-eval's data first, so unreachable data loads no model
        p = s.params(EVAL)
        env = distributed.setup(p["device"], key="eval.device")
        tok = tokenizers.load_tokenizer(SHARDS)
        lm_tasks = harness.load_tasks(p["lm_eval_tasks"], p["lm_eval_include"], p["lm_eval_fewshot"],
                                      echo=s.say) if p["lm_eval_tasks"] else None
        spec = str(MODEL) if p["model"] == "checkpoint" else p["model"]
        model = sampling.model_for_shards(spec, tok, SHARDS)
        block = model.config.block_size
        check_val_tokens("eval.val_tokens", p["val_tokens"], block, shards.split_tokens(SHARDS, "val"))
        tokens = val_loss.val_stream(SHARDS, p["val_tokens"], tok.vocab_size)
        examples = (hellaswag.hellaswag_examples(tok, p["hellaswag_path"], p["max_examples"], "eval.hellaswag_path",
                                             progress=env.is_main, block_size=block) if p["task"] == "hellaswag"
                    else cloze.build_cloze(tokens[:p["val_tokens"]], tok.eot, p["cloze_examples"], p["cloze_context"],
                                           p["cloze_ending"], p["seed"], key="eval.cloze_examples"))
        record = measured.measured_on(p, SHARDS, lm_tasks)  # what the figures are measured on, read before any pass
        model.to(env.device).eval()
        dtype = device.resolve_dtype(p["dtype"], env.device)
        run = dict(device=env.device, dtype=dtype, batch_size=p["batch_size"])
        loss = val_loss.val_loss(model, tokens, block, p["batch_size"], env.device, dtype, env.rank, env.world_size,
                              progress=env.is_main)
        bpc = val_loss.bits_per_char(loss, tokens, tok)  # comparable across tokenizers, unlike val_loss
        result = scorer.score_examples(model, examples, tok.vocab_size, progress=env.is_main, **run)
        if env.is_main:
            texts = sampling.sample(model, tok, p["sample_prompt"], p["samples"], p["sample_tokens"], p["temperature"],
                                    p["top_k"], p["seed"], env.device, dtype) if p["samples"] else []
            lm_eval, seconds = harness.score_tasks(model, tok, lm_tasks, p["lm_eval_fewshot"], p["lm_eval_limit"],
                                                   **run) if lm_tasks else ({}, {})
            scorer.write_predictions(OUT / "predictions.jsonl", result)
            sampling.write_samples(OUT / "samples.txt", p["sample_prompt"], texts, spec)
            write_json(OUT / "measured_on.json", record)
            task = {"acc": result.acc, "acc_norm": result.acc_norm, "count": result.count}
            write_json(OUT / "eval.json", {"eval": {"val_loss": loss, "bits_per_char": bpc}, p["task"]: task,
                                           **({"lm_eval": lm_eval} if lm_eval else {})})  # lm-eval's own names
            s.say(f"{spec}: val_loss {loss:.4f} ({bpc:.4f} bits/char), {p['task']} acc {result.acc:.4f} acc_norm "
                  f"{result.acc_norm:.4f} ({result.count} examples)", *harness.describe(lm_eval, seconds))


if __name__ == "__main__":
    main()
