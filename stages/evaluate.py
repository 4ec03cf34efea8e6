"""Stage `evaluate`: eval.model (model/ or any spec: OpenAI's baseline too) -> val loss, the multiple-choice tasks,
samples and lm-eval tasks -> metrics/eval.json, measured_on.json, predictions.jsonl, samples.txt."""
from __future__ import annotations

import math
from pathlib import Path

from gptcore import device, distributed
from gptcore.atomic import write_json
from gptcore.data.shard_set import ShardSet
from gptcore.errors import UserError
from gptcore.eval import harness, sampling
from gptcore.eval.config import EvalConfig, scored_tokens
from gptcore.eval.measured import measured_on
from gptcore.eval.scorer import score_examples, write_predictions
from gptcore.eval.tasks import tasks_named
from gptcore.eval.val_loss import bits_per_char, val_loss
from gptcore.model.lm_loss import loss_chunk_rows
from gptcore.model.load import model_for_shards
from stages.boundary import stage

# model/ is train's output, under train's lock on checkpoints/; metrics/'s lock covers evaluate's and compare's files
SHARDS, MODEL, TRAINED, OUT = Path("data/shards"), Path("model"), Path("checkpoints"), Path("metrics")


def main() -> None:
    """Score eval.model on the val shards and the task; rank 0 writes metrics/eval.json, predictions, samples."""
    with stage("evaluate", reads=[SHARDS, TRAINED], writes=[OUT]) as s:
        # every check of the user's input before any pass; lm-eval's data first, so unreachable data loads no model
        cfg = s.config(EvalConfig)
        timeouts = distributed.Timeouts(cfg.dist_timeout, cfg.dist_timeout, "eval.dist_timeout", "eval.dist_timeout")
        env = distributed.setup(cfg.device, key="eval.device", timeouts=timeouts)
        data = ShardSet.open(SHARDS)
        lm_tasks = harness.load_tasks(cfg.lm_eval_tasks, cfg.lm_eval_include, cfg.lm_eval_fewshot,
                                      echo=s.say) if cfg.lm_eval_tasks else None
        tasks = tasks_named(cfg.tasks, "eval.tasks")
        spec = str(MODEL) if cfg.model == "checkpoint" else cfg.model
        model = model_for_shards(spec, data)
        block, tok = model.config.block_size, data.tokenizer
        tokens = scored_tokens(cfg, block, data)
        examples = {name: task.examples(cfg, tok, tokens, block, env.is_main) for name, task in tasks.items()}
        record = measured_on(cfg, data, lm_tasks, len(tokens) - 1)  # what the figures are measured on, before any pass
        # the model's shape: compare sets the run beside the published model of the same one
        record["model"] = {k: getattr(model.config, k) for k in ("n_layer", "n_head", "n_embd")}
        model.to(env.device).eval()
        model.loss_chunk_rows = loss_chunk_rows(env.device.type, model.config.vocab_size, model.config.n_embd)
        record["lm_loss_chunk_rows"] = model.loss_chunk_rows  # the val loss's path: a switch changes its rounding
        dtype = device.resolve_dtype(cfg.dtype, env.device)
        run = dict(device=env.device, dtype=dtype, batch_size=cfg.eval_batch)
        loss = val_loss(model, tokens, block, cfg.eval_batch, env.device, dtype, env.rank, env.world_size,
                        progress=env.is_main)
        if not math.isfinite(loss):  # no figure of a model whose outputs overflow means anything; JSON holds no NaN
            raise UserError(f"{spec}: val loss {loss}: the model's outputs are not finite (its weights, or "
                            f"eval.dtype={cfg.dtype} overflowing): nothing was written")
        bpc = bits_per_char(loss, tokens, tok)  # comparable across tokenizers, unlike val_loss
        results = {name: score_examples(model, ex, tok.vocab_size, progress=env.is_main, **run)
                   for name, ex in examples.items()}
        if env.is_main:
            texts = sampling.sample(model, tok, cfg.sample_prompt, cfg.samples, cfg.sample_tokens, cfg.temperature,
                                    cfg.top_k, cfg.seed, env.device, dtype) if cfg.samples else []
            lm_eval, seconds = harness.score_tasks(model, tok, lm_tasks, cfg.lm_eval_fewshot, cfg.lm_eval_limit,
                                                   **run) if lm_tasks else ({}, {})
            write_predictions(OUT / "predictions.jsonl", results)
            sampling.write_samples(OUT / "samples.txt", cfg.sample_prompt, texts, spec)
            write_json(OUT / "measured_on.json", record)
            scores = {name: {"acc": r.acc, "acc_norm": r.acc_norm, "count": r.count} for name, r in results.items()}
            write_json(OUT / "eval.json", {"eval": {"val_loss": loss, "bits_per_char": bpc}, **scores,
                                           **({"lm_eval": lm_eval} if lm_eval else {})})  # lm-eval's own names
            said = "".join(f", {name} acc {r.acc:.4f} acc_norm {r.acc_norm:.4f} ({r.count} examples)"
                           for name, r in results.items())
            s.say(f"{spec}: val_loss {loss:.4f} ({bpc:.4f} bits/char){said}", *harness.describe(lm_eval, seconds))
        distributed.teardown()  # every rank, once rank 0 has written metrics/


if __name__ == "__main__":
    main()
