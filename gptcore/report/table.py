"""The comparison table of a sweep, from `dvc exp show --json`: experiments grouped by the params they differ in
(seeds pooled), each metric as mean and standard deviation over the group's seeds. `--changed` shows, of the params,
each experiment's preset and those -S values changed, for any mix of presets. A queued, running or failed
experiment has no figures of its own yet (DVC shows it the files of the workspace it was queued from): it is listed
under the table, never in it. Parameter counts and FLOPs per token are computed from each experiment's `model:`
params, as constants of its config.

    dvc exp show --json > exps.json && python -m gptcore.report.table exps.json

docs/modern-recipe.md says what the groups, columns and `--baseline`'s difference mean.
"""
from __future__ import annotations

import argparse
import difflib
import functools
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable

from gptcore.errors import UserError, one_line_errors

# metric columns: dotted keys over the metrics files merged (each key lives in one file)
METRICS = ("eval.val_loss", "speedrun.tokens_to_target", "speedrun.hours_to_target", "params",
           "params_non_embedding", "flops_per_token")
IGNORED = ("train.seed",)
SIZES = ("params", "params_non_embedding", "flops_per_token")  # of the config: counted from the model params


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def experiments(doc: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The experiments of a `dvc exp show --json` document: [{"name", "state", "params", "metrics"}], params and
    metrics flattened to dotted keys (params of params.yaml; metrics of every metrics file, merged, and the constants
    of SIZES). `state` is None for a finished experiment, else DVC's (queued, running, failed), and then `metrics`
    is empty: what DVC shows for one is the queuing workspace's files, another run's figures. A finished experiment
    without metrics (stopped outside DVC's queue) is left out."""
    rows = []
    for commit in doc:
        for exp in commit.get("experiments") or []:
            state = (exp.get("executor") or {}).get("state")
            state = None if state in (None, "success") else state
            for rev in exp.get("revs") or []:
                data = rev.get("data") or {}
                metrics: dict[str, Any] = {}
                for file in (data.get("metrics") or {}).values():
                    metrics.update(flatten(file.get("data") or {}))
                params = flatten(((data.get("params") or {}).get("params.yaml") or {}).get("data") or {})
                if state is not None:
                    metrics = {}
                elif not metrics:
                    continue
                else:
                    metrics.update(config_sizes(json.dumps({k[6:]: v for k, v in params.items()
                                                             if k.startswith("model.")}, sort_keys=True)) or {})
                rows.append({"name": rev.get("name") or rev.get("rev"), "state": state, "params": params,
                             "metrics": metrics})
    return rows


@functools.cache
def config_sizes(model_section: str) -> dict[str, int] | None:
    """SIZES of a `model:` section (JSON), counted on the model built on the meta device (no memory, no init); None
    where the shape is not in the params: a vocabulary read from the data (vocab_size: auto), weights loaded
    (init_from), or a section this code does not read."""
    import torch

    from gptcore.model.config import ModelConfig
    from gptcore.model.gpt import GPT, GPTConfig
    from gptcore.report.flops import model_sizes

    try:
        cfg = ModelConfig.read(json.loads(model_section))
    except UserError:
        return None
    if cfg.vocab_size == "auto" or cfg.init_from != "scratch":
        return None
    with torch.device("meta"):
        model = GPT(GPTConfig(**{k: getattr(cfg, k) for k in GPTConfig.params()}))
    return model_sizes(model)


def summarize(rows: list[dict[str, Any]], metrics: Iterable[str] = METRICS, ignore: Iterable[str] = IGNORED,
              also: Iterable[str] = ()) -> tuple[list[str], list[dict[str, Any]]]:
    """The param keys whose values differ across `rows` (minus `ignore`), with the keys of `also` (columns to show
    whatever their values), and one entry per group of rows with the same values of those, in order of first
    appearance: {"params": {key: value}, "n", "names", "metrics": {metric: {"mean", "std" (the sample standard
    deviation, None under two values), "count" (seeds that have the metric)}}}."""
    keys = sorted({k for r in rows for k in r["params"]} - set(ignore))
    varying = [k for k in keys if len({json.dumps(r["params"].get(k)) for r in rows}) > 1 or k in set(also)]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(json.dumps([r["params"].get(k) for k in varying]), []).append(r)
    out = []
    for g in groups.values():
        stats = {}
        for m in metrics:
            values = [float(r["metrics"][m]) for r in g if isinstance(r["metrics"].get(m), (int, float))]
            stats[m] = {"mean": statistics.fmean(values) if values else None,
                        "std": statistics.stdev(values) if len(values) > 1 else None, "count": len(values)}
        out.append({"params": {k: g[0]["params"].get(k) for k in varying}, "n": len(g),
                    "names": [r["name"] for r in g], "metrics": stats})
    return varying, out


def commit_params(doc: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The flattened params of each commit a `dvc exp show --json` document holds (the experiments' baselines, such
    as the committed quick-start run), the workspace left out."""
    return [flatten(((commit.get("data") or {}).get("params") or {}).get("params.yaml", {}).get("data") or {})
            for commit in doc if commit.get("rev") != "workspace"]


def changed_within_presets(params: list[dict[str, Any]], ignore: Iterable[str] = IGNORED) -> list[str]:
    """`preset` and the keys that differ between runs of one preset (`params`: each run's flattened params, the
    experiments' and their baseline commits'): what -S values changed, not what a preset sets (every key two presets
    set apart would be a column)."""
    by_preset: dict[str, list[dict]] = {}
    for p in params:
        by_preset.setdefault(json.dumps(p.get("preset")), []).append(p)
    keys = sorted({k for p in params for k in p} - set(ignore) - {"preset"})
    return ["preset", *(k for k in keys if any(len({json.dumps(p.get(k)) for p in group}) > 1
                                               for group in by_preset.values()))]


def versus(groups: list[dict[str, Any]], base: dict[str, Any], metric: str) -> list[dict[str, Any] | None]:
    """Each group's difference from `base` in `metric`: {"diff": mean - base mean, "sd_diff": sd * sqrt(1/n_a + 1/n_b),
    "sd": the seed-to-seed standard deviation pooled over both groups (weights n - 1: a one-seed row borrows the
    baseline's spread), "beyond_2sd": |diff| > 2 sd}; None where a mean is missing or neither group has two seeds."""
    b = base["metrics"][metric]
    out: list[dict[str, Any] | None] = []
    for g in groups:
        s = g["metrics"][metric]
        spreads = [(x["count"] - 1, x["std"]) for x in (s, b) if x["std"] is not None and x["count"] > 1]
        dof = sum(d for d, _ in spreads)
        if s["mean"] is None or b["mean"] is None or not dof:
            out.append(None)
            continue
        sd = math.sqrt(sum(d * v * v for d, v in spreads) / dof)
        diff = s["mean"] - b["mean"]
        out.append({"diff": diff, "sd_diff": sd * math.sqrt(1 / s["count"] + 1 / b["count"]), "sd": sd,
                    "beyond_2sd": abs(diff) > 2 * sd})
    return out


def _order(value: Any) -> tuple:
    """A sort key that orders numbers by value, other values by their text, and missing ones last."""
    if value is None:
        return (2, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value))


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def markdown(varying: list[str], groups: list[dict[str, Any]], metrics: Iterable[str] = METRICS,
             show: list[str] | None = None, base: dict[str, Any] | None = None, names: bool = False) -> str:
    """A Markdown table: the varying params (or those of them in `show`), seeds, then "mean ± std" per metric
    ("(k/n)" where only k seeds have it). With a `base` group, two more columns for the first metric: its difference
    from the base ("± the difference's standard deviation") and whether that exceeds twice the pooled seed-to-seed
    standard deviation. `names`: a first column with the group's experiment names."""
    metrics = list(metrics)
    if show is not None:
        varying = [k for k in varying if k in show]
    head = [*(["experiments"] if names else []), *varying, "seeds", *metrics]
    diffs = versus(groups, base, metrics[0]) if base is not None else []
    if base is not None:
        head += [f"Δ {metrics[0]}", "> 2 sd"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, g in enumerate(groups):
        cells = ([", ".join(map(str, g["names"]))] if names else []) + [str(g["params"][k]) for k in varying]
        cells.append(str(g["n"]))
        for m in metrics:
            s = g["metrics"][m]
            cell = _fmt(s["mean"]) + (f" ± {_fmt(s['std'])}" if s["std"] is not None else "")
            if s["count"] != g["n"]:
                cell += f" ({s['count']}/{g['n']})"
            cells.append(cell)
        if base is not None:
            d = diffs[i]
            if g is base:
                cells += ["(baseline)", ""]
            elif d is None:
                cells += ["-", "-"]
            else:
                cells += [f"{d['diff']:+.3f} ± {d['sd_diff']:.3f}", "yes" if d["beyond_2sd"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- the command's input and arguments, each checked before any work ---

EXP_SHOW = "expected what `dvc exp show --json` prints"


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _expect(value: Any, kind: type, where: str, path: str, optional: bool = True) -> Any:
    """`value` where it is a `kind` (or None, where `optional`), else a UserError naming the file and the place."""
    if isinstance(value, kind) or (optional and value is None):
        return value
    want = "a mapping" if kind is dict else "a list"
    raise UserError(f"{where}: {path} is {_kind(value)}, not {want}: {EXP_SHOW}")


def check_exp_show(doc: Any, where: str) -> None:
    """A UserError naming the file and the place of the first part of `doc` that is not of the shape `dvc exp show
    --json` prints (a list of commits, each with its experiments' revisions, their params and metrics files)."""
    for i, commit in enumerate(_expect(doc, list, where, "the document", optional=False)):
        at = f"[{i}]"
        _expect(commit, dict, where, at, optional=False)
        for j, exp in enumerate(_expect(commit.get("experiments"), list, where, f"{at}.experiments") or []):
            ex = f"{at}.experiments[{j}]"
            _expect(exp, dict, where, ex, optional=False)
            _expect(exp.get("executor"), dict, where, f"{ex}.executor")
            for k, rev in enumerate(_expect(exp.get("revs"), list, where, f"{ex}.revs") or []):
                rv = f"{ex}.revs[{k}]"
                data = _expect(_expect(rev, dict, where, rv, optional=False).get("data"), dict, where, f"{rv}.data")
                for name, file in (_expect((data or {}).get("metrics"), dict, where, f"{rv}.data.metrics")
                                   or {}).items():
                    got = _expect(file, dict, where, f"{rv}.data.metrics[{name!r}]")
                    _expect((got or {}).get("data"), dict, where, f"{rv}.data.metrics[{name!r}].data")
                params = _expect((data or {}).get("params"), dict, where, f"{rv}.data.params") or {}
                got = _expect(params.get("params.yaml"), dict, where, f"{rv}.data.params['params.yaml']")
                _expect((got or {}).get("data"), dict, where, f"{rv}.data.params['params.yaml'].data")


def _check_keys(flag: str, keys: Iterable[str] | None, known: set[str], what: str, listed: list[str]) -> None:
    """A UserError for the first of `keys` (given with `flag`) that is none of `known` (`what` they are), naming the
    closest known key and `listed` (the table's param columns, or the metrics there are)."""
    for key in keys or ():
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            more = f", ... ({len(listed)} in all)" if len(listed) > 12 else ""
            there = f"the {what} columns here: " if what == "param" else f"the {what}s there are: "
            raise UserError(f"{flag} {key!r}: no experiment has this {what}{hint}; {there}"
                            f"{', '.join(listed[:12]) or 'none (no param differs)'}{more}")


def _check_only(pattern: str | None, rows: list[dict[str, Any]], kept: list[dict[str, Any]]) -> None:
    """A UserError where --only matches none of the experiments (naming some of them)."""
    if pattern and rows and not kept:
        names = [str(r["name"]) for r in rows]
        more = f", ... ({len(names)} in all)" if len(names) > 8 else ""
        raise UserError(f"--only {pattern!r}: matches none of the experiments ({', '.join(names[:8])}{more})")


def main(argv: list[str] | None = None) -> None:
    """gptcore-exp-table: `dvc exp show --json` in, the grouped mean ± std table (Markdown) out."""
    ap = argparse.ArgumentParser(prog="gptcore-exp-table", description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="?", default="-", help="a file holding `dvc exp show --json` (default: stdin)")
    ap.add_argument("--metrics", nargs="+", default=None, help=f"dotted metric keys (default: {' '.join(METRICS)})")
    ap.add_argument("--ignore", nargs="*", default=None,
                    help=f"param keys pooled over, not grouped by (default: {' '.join(IGNORED)})")
    ap.add_argument("--only", default=None, help="a regular expression: only experiments whose name matches")
    ap.add_argument("--show", nargs="*", default=None,
                    help="param columns to show (default: every param that differs; none if given empty); grouping "
                         "still uses them all")
    ap.add_argument("--changed", action="store_true",
                    help="param columns: preset, and the params that differ between experiments of one preset (what "
                         "their -S changed), not every param two presets set apart; grouping still uses them all")
    ap.add_argument("--names", action="store_true", help="a first column with each group's experiment names")
    ap.add_argument("--sort", nargs="+", default=None,
                    help="param keys to order the groups by (default: the order of `dvc exp show`)")
    ap.add_argument("--baseline", default=None,
                    help="a regular expression naming the experiments of one group: the table adds each group's "
                         "difference from it in the first metric and whether it exceeds twice the seed-to-seed sd")
    ap.add_argument("--json-out", action="store_true", help="print the groups as JSON instead of a table")
    args = ap.parse_args(argv)
    with one_line_errors("gptcore-exp-table"):
        for flag, pattern in (("--only", args.only), ("--baseline", args.baseline)):
            try:
                re.compile(pattern or "")
            except re.error as e:
                raise UserError(f"{flag} {pattern!r}: not a regular expression ({e})") from None
        try:
            doc = json.loads(sys.stdin.read() if args.json == "-" else Path(args.json).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"{args.json}: not readable as dvc exp show --json output ({e})") from None
        check_exp_show(doc, args.json)
        rows = every = experiments(doc)
        if args.only:
            rows = [r for r in rows if re.search(args.only, str(r["name"]))]
            _check_only(args.only, every, rows)
        waiting = [r for r in rows if r["state"] is not None]
        rows = [r for r in rows if r["state"] is None]
        if not rows:
            raise UserError(f"{args.json}: no finished experiment (run `dvc exp show --json` in the repo "
                            f"where the experiments ran)")
        params = {k for r in every for k in r["params"]}
        metrics = args.metrics or list(METRICS)
        ignore = IGNORED if args.ignore is None else args.ignore
        changed = changed_within_presets([r["params"] for r in rows] + commit_params(doc), ignore)
        varying, groups = summarize(rows, metrics, ignore, also=changed if args.changed else ())
        _check_keys("--ignore", args.ignore, params, "param", varying)
        known = sorted({k for r in rows for k in r["metrics"]})
        _check_keys("--metrics", args.metrics, set(known), "metric", known)
        _check_keys("--show", args.show, params, "param", varying)
        _check_keys("--sort", args.sort, params, "param", varying)
        if args.sort:
            groups.sort(key=lambda g: [_order(g["params"].get(k)) for k in args.sort])
        base = None
        if args.baseline:
            hits = [g for g in groups if any(re.search(args.baseline, str(n)) for n in g["names"])]
            if len(hits) != 1:
                raise UserError(f"--baseline {args.baseline!r}: names experiments of {len(hits)} groups "
                                f"({', '.join(str(g['names'][0]) for g in hits) or 'none'}); it must name one group")
            base = hits[0]
        if args.json_out:
            if base is not None:  # the table computes its own differences; JSON carries them per group
                for g, d in zip(groups, versus(groups, base, metrics[0])):
                    g["versus_baseline"] = d
            print(json.dumps({"varying": varying, "groups": groups}, indent=1))
        else:
            show = [*changed, *(k for k in args.show or () if k not in changed)] if args.changed else args.show
            print(markdown(varying, groups, metrics, show, base, args.names))
            if waiting:  # their params only: no figure of theirs exists yet
                print("\nnot finished, no figures: " + ", ".join(f"{r['name']} ({r['state']})" for r in waiting))


if __name__ == "__main__":
    main()
