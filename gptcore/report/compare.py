"""Set a run's evaluation metrics beside published reference figures: baseline values and run - baseline deltas,
each written only when the run measured what the baseline measured (metrics/measured_on.json against
conf/baselines.yaml's `<figure>_measured_on`; docs/evaluation.md gives the rules); else `comparable` says why not.
A run is set beside the model of its own shape (an entry's `shape`, say GPT-2 350M's 24 x 1024), or, when no entry
has its shape, beside the smallest of each family (gpt2_124m, gpt3_124m)."""
from __future__ import annotations

from typing import Any

from gptcore.report.baselines import baseline_values, lm_eval_metrics, lm_eval_values
from gptcore.report.curves import CHANCE

# delta key -> (run figure, family of baseline entries in conf/baselines.yaml, that entry's figure)
DELTAS = {
    "val_loss_vs_gpt2": ("val_loss", "gpt2", "val_loss"),
    "hellaswag_acc_norm_vs_gpt2": ("hellaswag_acc_norm", "gpt2", "hellaswag_acc_norm"),
    "hellaswag_acc_norm_vs_gpt3": ("hellaswag_acc_norm", "gpt3", "hellaswag_acc_norm"),
}
FAMILIES = {"gpt2": "GPT-2", "gpt3": "GPT-3"}  # an entry <family>_<size>; <family>_124m is a family's default
SHAPE = ("n_layer", "n_head", "n_embd")  # what makes a model "of the same size" as a baseline's
NO_RECORD = "evaluate recorded nothing of what it measured on (no metrics/measured_on.json): rerun evaluate"
SAME = "the run measured what the baseline measured"  # the reason given beside a delta that was written


def reference_entry(baselines: dict[str, Any], family: str, shape: dict[str, Any] | None) -> tuple[str, str | None]:
    """The entry of `family` a run of `shape` (measured_on.json's `model`) is set beside, and why it is not set beside
    any (None: it is). A shape some entry has picks that family's entry of that shape; any other the default."""
    mine = {k: (shape or {}).get(k) for k in SHAPE}
    shaped = {name: {k: (body.get("shape") or {}).get(k) for k in SHAPE} for name, body in baselines.items()
              if isinstance(body, dict) and body.get("shape")}
    if mine not in shaped.values():
        return f"{family}_124m", None
    for name, theirs in shaped.items():
        if name.startswith(f"{family}_") and theirs == mine:
            return name, None
    return family, (f"no published {FAMILIES[family]} figure of a model of this run's shape ({mine['n_layer']} "
                    f"blocks of {mine['n_embd']:,} wide)")


def why_val_split_differs(split: dict[str, Any], base: dict[str, Any]) -> str | None:
    """None when the run's val split (measured_on.json's `val_split`) is the baseline's; else the reason."""
    listed = split.get("val_sha256") and set(split["val_sha256"]) <= set(base["val_sha256"])
    if listed and split.get("val_tokens") == base["split_tokens"]:
        return _scored_differ(split, base)  # the very tokens the baseline lists, wherever the files came from
    if split.get("source") == "local":
        return (f"the run's val split is from local files {split.get('dataset')!r}; a copy compares only when its val "
                f"shards (sha256 {', '.join(split.get('val_sha256') or [])}) are listed in conf/baselines.yaml "
                f"val_loss_measured_on.val_sha256")
    got = (split.get("source"), split.get("dataset"), split.get("config"))
    if got != ("hub", base["dataset"], base["config"]):
        return (f"the run's val split is from {got[0]} {got[1]!r} config {got[2]!r}, the baseline's from the hub's "
                f"{base['dataset']} config {base['config']!r}")
    if base["revision"] is not None and split.get("revision") != base["revision"]:
        return f"the run's data is revision {split.get('revision')}, the baseline's {base['revision']}"
    if split.get("split_tokens") != base["split_tokens"] or split.get("val_tokens") != base["split_tokens"]:
        return (f"the run's val split is its first {split.get('val_tokens')!r} tokens (tokenize.val_tokens: "
                f"{split.get('split_tokens')!r}), the baseline's the first {base['split_tokens']:,}")
    return _scored_differ(split, base)


def _scored_differ(split: dict[str, Any], base: dict[str, Any]) -> str | None:
    """The reason a loss over another count of the split's tokens is not the baseline's loss (None: the same count)."""
    if split.get("scored_tokens") == base["scored_tokens"]:
        return None
    return (f"the run's val loss is over {split.get('scored_tokens')!r} tokens of the split (eval.val_tokens), the "
            f"baseline's over its first {base['scored_tokens']:,}")


def why_not_comparable(figure: str, run: dict[str, Any], measured: dict[str, Any], base: dict[str, Any]) -> str | None:
    """None when the run's `figure` was measured on what the baseline's was (`base`: its `_measured_on`), as the
    run's `measured` (measured_on.json) says; else the reason, in words."""
    if not measured:
        return NO_RECORD
    tokenizer = measured["val_split"].get("tokenizer")
    if tokenizer != "gpt2":
        return f"the run's tokenizer is {tokenizer!r}, the baseline's GPT-2 BPE (other units)"
    if figure == "val_loss":
        if run.get("eval", {}).get("val_loss") is None:
            return "the run has no val loss"
        return why_val_split_differs(measured["val_split"], base)
    if figure == "hellaswag_acc_norm":
        hs = run.get("hellaswag")
        if not hs or hs.get("acc_norm") is None:
            return "the run has no HellaSwag figure (eval.tasks has no hellaswag)"
        sha = (measured.get("hellaswag") or {}).get("sha256")
        if sha != base["sha256"]:
            return (f"the run read HellaSwag from {(measured.get('hellaswag') or {}).get('file')} (sha256 {sha}), "
                    f"the baseline the official file (sha256 {base['sha256']}; eval.hellaswag_path: null)")
        if hs.get("count") != base["examples"]:
            return (f"the run scored {hs.get('count')} HellaSwag examples, the baseline the full "
                    f"{base['examples']:,} (eval.max_examples: null)")
        return None
    raise ValueError(f"no comparability rule for {figure!r}")


def why_lm_eval_not_comparable(ours: dict[str, Any] | None, task: str, metric: str, published: dict[str, Any],
                               source: dict[str, Any] | None) -> str | None:
    """None when the run's lm-eval `task` scored `metric` as the published figure did: lm-eval's own task of that
    name (`source`: measured_on.json's record of it), the same few-shot count and the task's full example set, of
    the size the baseline reports; else the reason."""
    if not ours:
        return f"the run did not score lm-eval task {task} (eval.lm_eval_tasks)"
    if ours.get(metric) is None:
        return f"the run's lm-eval {task} has no {metric}"
    if source is None:
        return NO_RECORD
    if not source:
        return f"evaluate recorded no source for lm-eval task {task} (metrics/measured_on.json)"
    if source.get("task_from") != published["task_from"]:
        return (f"the run's {task} is from {source.get('task_from')} ({source.get('yaml')}), the baseline's is "
                f"lm-eval's own {task}")
    if ours.get("num_fewshot") != published["num_fewshot"]:
        return (f"the run scored {task} {ours.get('num_fewshot')}-shot, the baseline {published['num_fewshot']}-shot "
                f"(eval.lm_eval_fewshot)")
    if ours.get("samples") != ours.get("samples_total") or ours.get("samples") != published["samples"]:
        return (f"the run scored {ours.get('samples')} of {ours.get('samples_total')} {task} examples, the baseline "
                f"all {published['samples']:,} (eval.lm_eval_limit: null)")
    return None


def summarize(run: dict[str, Any], baselines: dict[str, Any], measured: dict[str, Any] | None) -> dict[str, Any]:
    """The run beside the baselines: `run` is evaluate's eval.json, `measured` its measured_on.json ({} or None when
    evaluate wrote none: no delta). Returns {"baseline": {"<entry>_<figure>": value}, "delta": {...}, "comparable":
    {...}}: each delta key names the baseline it subtracts (`_vs_gpt2`: OpenAI GPT-2 124M, `_vs_gpt3`: GPT-3 Small);
    `comparable[key]` is {"baseline": entry, "comparable": whether the delta was written, \
"reason": why not (or SAME)}."""
    ours = {"val_loss": run.get("eval", {}).get("val_loss"),
            "hellaswag_acc_norm": run.get("hellaswag", {}).get("acc_norm")}
    baseline = {**baseline_values(baselines), **lm_eval_values(baselines)}  # the names plots and README use
    shape = (measured or {}).get("model")
    chosen = {family: reference_entry(baselines, family, shape) for family in FAMILIES}
    judged = []  # (delta key, baseline entry, why it is not comparable or None, the run's figure, the baseline's)
    for key, (figure, family, base_figure) in DELTAS.items():
        name, none = chosen[family]
        body = baselines.get(name) or {}
        if none is None and base_figure not in body:
            none = (f"{body.get('description', name)} has no published {base_figure} (dvc exp run -S "
                    f"preset={name}_openai measures one with this code)")
        if none is not None:
            judged.append((key, name, none, ours[figure], None))
            continue
        reason = why_not_comparable(figure, run, measured or {}, body[f"{base_figure}_measured_on"])
        judged.append((key, name, reason, ours[figure], body[base_figure]))
    scored = run.get("lm_eval") or {}
    sources = ((measured or {}).get("lm_eval") or {}).get("tasks") or {}
    if scored:  # lm-eval deltas are explained only for runs that scored lm-eval tasks at all
        for family, (name, _) in chosen.items():
            for task, published in ((baselines.get(name) or {}).get("lm_eval") or {}).items():
                for metric, value in lm_eval_metrics(published).items():
                    reason = why_lm_eval_not_comparable(scored.get(task), task, metric, published,
                                                        sources.get(task, {}) if measured else None)
                    judged.append((f"lm_eval_{task}_{metric}_vs_{family}", name, reason,
                                   (scored.get(task) or {}).get(metric), value))
    return {"baseline": baseline, "delta": {key: mine - theirs for key, _, why, mine, theirs in judged if why is None},
            "comparable": {key: {"baseline": name, "comparable": why is None, "reason": why or SAME}
                           for key, name, why, _, _ in judged}}


def describe(summary: dict[str, Any], baselines: dict[str, Any]) -> list[str]:
    """One line per delta written ('key: run - <the baseline's description> = +x'), then one line for all the figures
    not compared, each reason once with the keys it holds for (metrics/comparison.json keeps every reason)."""
    lines, skipped = [], {}
    for key, c in summary["comparable"].items():
        if c["comparable"]:
            desc = baselines.get(c["baseline"], {}).get("description", c["baseline"])
            lines.append(f"{key}: run - {desc} = {summary['delta'][key]:+.4f}")
        else:
            skipped.setdefault(c["reason"], []).append(key)
    if skipped:
        why = "; ".join(f"{', '.join(keys)}: {reason}" for reason, keys in skipped.items())
        lines.append(f"not compared ({sum(map(len, skipped.values()))} figures; metrics/comparison.json): {why}")
    return lines


def comparable_figures(comparable: dict[str, Any]) -> dict[str, bool]:
    """summarize's `comparable` as {reference figure, a baselines.tsv column (e.g. gpt2_124m_val_loss): whether the run
    is comparable with it}: the plots draw only those."""
    return {f"{comparable[key]['baseline']}_{figure}": comparable[key]["comparable"]
            for key, (_, _, figure) in DELTAS.items() if key in comparable}


def final_acc_norm(run: dict[str, Any]) -> dict[str, float]:
    """{task: acc_norm} of the multiple-choice tasks evaluate scored (eval.tasks): eval.json's entries with an
    acc_norm and a count."""
    return {task: scores["acc_norm"] for task, scores in run.items()
            if isinstance(scores, dict) and scores.get("acc_norm") is not None and "count" in scores}


def own_text(summary: dict[str, Any], measured: dict[str, Any] | None) -> bool:
    """Whether the run's val split is local files no baseline lists: the user's own text, on which neither the
    published val losses nor the committed run (the quick start's Shakespeare) were measured."""
    local = ((measured or {}).get("val_split") or {}).get("source") == "local"
    return local and "val_loss_vs_gpt2" not in summary["delta"]


def measured_line(run: dict[str, Any], speedrun: dict[str, Any], own: bool = False) -> str:
    """compare's last line: what the run measured, each figure beside what it is read against (chance, the target),
    and how to set it beside the committed run; on the user's own text (`own`), that nothing published was measured
    on it instead."""
    parts = [f"eval val_loss {run['eval']['val_loss']:.4f}"]
    parts += [f"{task} acc_norm {value:.4f} (chance {CHANCE})" for task, value in final_acc_norm(run).items()]
    target = speedrun.get("target_val_loss")
    if target is not None:
        parts.append(f"the target val loss {target} " + (f"reached at step {speedrun['steps_to_target']}"
                                                         if speedrun.get("reached") else "not reached"))
    if own:
        return f"measured: {', '.join(parts)}; no published figure is on this text (metrics/comparison.json)"
    return f"measured: {', '.join(parts)}; beside the committed run: dvc metrics diff HEAD"


def split_outputs(summary: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`summary` (summarize's, the stage's `speedrun` figures added) in two: metrics/summary.json, a DVC metric, holds
    only what the run measured ({"delta", "speedrun"}), so each `dvc exp show` column is a figure of that run;
    metrics/comparison.json, a plain out (constants and sentences would make each row hundreds of characters wide),
    what it was set beside ({"baseline", "comparable", "target_val_loss": the param compare.target_val_loss})."""
    speedrun = summary["speedrun"]
    measured = {k: v for k, v in speedrun.items() if k != "target_val_loss"}
    return ({"delta": summary["delta"], "speedrun": measured},
            {"baseline": summary["baseline"], "comparable": summary["comparable"],
             "target_val_loss": speedrun.get("target_val_loss")})
