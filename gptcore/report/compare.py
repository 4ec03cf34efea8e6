"""Set a run's evaluation metrics beside published reference figures: baseline values and run - baseline deltas.

A delta is written only when the run measured the same thing as the baseline: the same task on the same split
(HellaSwag: the full 10,042-example val set) and the same data in the same units (val loss: FineWeb-Edu val in
GPT-2 BPE tokens); for lm-eval figures, the same task, metric, few-shot count and full example set (lm-eval
scores text, so any tokenizer compares). Otherwise `comparable` says why the delta is absent.
"""
from __future__ import annotations

from typing import Any

from gptcore.eval.hellaswag import HELLASWAG_VAL_EXAMPLES
from gptcore.report.baselines import baseline_values, lm_eval_metrics, lm_eval_values

FINEWEB_EDU = "HuggingFaceFW/fineweb-edu"
# delta key -> (run figure, baseline entry in conf/baselines.yaml, that entry's figure)
DELTAS = {
    "val_loss_vs_gpt2": ("val_loss", "gpt2_124m", "val_loss"),
    "hellaswag_acc_norm_vs_gpt2": ("hellaswag_acc_norm", "gpt2_124m", "hellaswag_acc_norm"),
    "hellaswag_acc_norm_vs_gpt3": ("hellaswag_acc_norm", "gpt3_124m", "hellaswag_acc_norm"),
}


def why_not_comparable(figure: str, run: dict[str, Any], data: dict[str, Any]) -> str | None:
    """None when the run's `figure` was measured as the baselines' was; else the reason, in words."""
    if data.get("tokenizer") != "gpt2":
        return f"the run's tokenizer is {data.get('tokenizer')!r}, the baseline's GPT-2 BPE (other units)"
    if figure == "val_loss":
        if run.get("eval", {}).get("val_loss") is None:
            return "the run has no val loss"
        if data.get("dataset") != FINEWEB_EDU:
            return f"the run's val split is from {data.get('dataset')!r}, the baseline's from {FINEWEB_EDU} val"
        return None
    if figure == "hellaswag_acc_norm":
        hs = run.get("hellaswag")
        if not hs or hs.get("acc_norm") is None:
            return "the run has no HellaSwag figure (eval.task is not hellaswag)"
        if hs.get("count") != HELLASWAG_VAL_EXAMPLES:
            return (f"the run scored {hs.get('count')} HellaSwag examples, the baseline the full "
                    f"{HELLASWAG_VAL_EXAMPLES:,} (eval.max_examples: null)")
        return None
    raise ValueError(f"no comparability rule for {figure!r}")


def why_lm_eval_not_comparable(ours: dict[str, Any] | None, task: str, metric: str,
                               published: dict[str, Any]) -> str | None:
    """None when the run's lm-eval `task` scored `metric` as the published figure did: the same task name, the same
    few-shot count and the task's full example set, of the size the baseline reports; else the reason."""
    if not ours:
        return f"the run did not score lm-eval task {task} (eval.lm_eval_tasks)"
    if ours.get(metric) is None:
        return f"the run's lm-eval {task} has no {metric}"
    if ours.get("num_fewshot") != published["num_fewshot"]:
        return (f"the run scored {task} {ours.get('num_fewshot')}-shot, the baseline {published['num_fewshot']}-shot "
                f"(eval.lm_eval_fewshot)")
    if ours.get("samples") != ours.get("samples_total") or ours.get("samples") != published["samples"]:
        return (f"the run scored {ours.get('samples')} of {ours.get('samples_total')} {task} examples, the baseline "
                f"all {published['samples']:,} (eval.lm_eval_limit: null)")
    return None


def summarize(run: dict[str, Any], baselines: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """The run beside the baselines. `run` is evaluate's eval.json ({"eval": {"val_loss"}, "hellaswag": {"acc_norm", "count"}, ...}); `data` says
    what the run was evaluated on ({"tokenizer": name, "dataset": the fetched dataset's name}).

    Returns {"baseline": {"<entry>_<figure>": value}, "delta": {...}, "comparable": {...}}: each delta key names the baseline it subtracts
    (`_vs_gpt2`: OpenAI GPT-2 124M, `_vs_gpt3`: GPT-3 Small); `comparable[key]` names the baseline and says whether
    the delta was written, with the reason when it was not."""
    ours = {
        "val_loss": run.get("eval", {}).get("val_loss"),
        "hellaswag_acc_norm": run.get("hellaswag", {}).get("acc_norm"),
    }
    baseline = baseline_values(baselines)  # {"gpt2_124m_val_loss": ..., ...}: the names plots and README use
    delta: dict[str, float] = {}
    comparable: dict[str, dict[str, Any]] = {}
    for key, (figure, name, base_figure) in DELTAS.items():
        if base_figure not in baselines.get(name, {}):
            continue
        reason = why_not_comparable(figure, run, data)
        comparable[key] = {"baseline": name, "comparable": reason is None}
        if reason is None:
            delta[key] = ours[figure] - baselines[name][base_figure]
        else:
            comparable[key]["reason"] = reason
    baseline.update(lm_eval_values(baselines))
    scored = run.get("lm_eval") or {}
    if scored:  # lm-eval deltas are explained only for runs that scored lm-eval tasks at all
        for name, body in baselines.items():
            for task, published in (body.get("lm_eval") or {}).items():
                for metric, value in lm_eval_metrics(published).items():
                    key = f"lm_eval_{task}_{metric}_vs_{name.split('_')[0]}"
                    reason = why_lm_eval_not_comparable(scored.get(task), task, metric, published)
                    comparable[key] = {"baseline": name, "comparable": reason is None}
                    if reason is None:
                        delta[key] = scored[task][metric] - value
                    else:
                        comparable[key]["reason"] = reason
    return {"baseline": baseline, "delta": delta, "comparable": comparable}


def describe(summary: dict[str, Any], baselines: dict[str, Any]) -> list[str]:
    """One line per delta: 'key: run - <the baseline's description> = +x', or why it is not given."""
    lines = []
    for key, c in summary["comparable"].items():
        desc = baselines.get(c["baseline"], {}).get("description", c["baseline"])
        if c["comparable"]:
            lines.append(f"{key}: run - {desc} = {summary['delta'][key]:+.4f}")
        else:
            lines.append(f"{key}: not comparable with {desc}: {c['reason']}")
    return lines
