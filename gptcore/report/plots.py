"""The plots: the compare stage's data beside dvclive's curves, the offline page `dvc plots show` fills, and DVC's
plots rendered to files with vl-convert (Vega-Lite compiled and drawn locally: no browser, no network).

The library never runs DVC: you run it and pipe its JSON in (console script gptcore-render-plots):
    dvc plots show --json | gptcore-render-plots                       # the workspace's plots -> plots_png/*.png
    dvc plots diff exp-a1b2c exp-d3e4f --json | gptcore-render-plots  # two experiments, curves overlaid
    gptcore-render-plots --page                                        # plots/offline.html, where compare has not run
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from gptcore.atomic import atomic_write
from gptcore.errors import UserError, one_line_errors
from gptcore.report.baselines import baseline_values
from gptcore.report.steplog import read_step_tsv, write_tsv

PNG_DIR = Path("plots_png")

# dvclive step metrics that get a tokens_seen column for the plots against tokens seen, and the suffix of a task's
# accuracy curve logged in training (train.tasks: `<task>_acc_norm`), which goes on the accuracy plot
CURVES = ("train_loss", "val_loss")
ACC_NORM = "_acc_norm"


# --- plot data (the compare stage) ---

def tokens_per_step(live_dir: str | Path) -> float:
    """Tokens per optimizer step, from dvclive's tokens_seen.tsv (tokens seen after step s = (s + 1) x this); 0 when
    the run took no step (train.max_steps 0): everything it logged is at zero tokens."""
    path = Path(live_dir) / "plots" / "metrics" / "tokens_seen.tsv"
    rows = read_step_tsv(path) if path.is_file() else []
    if not rows:
        return 0.0
    step, tokens = rows[-1]
    return tokens / (step + 1)


def smooth_half_width(n: int) -> int:
    """Points on each side of the train loss's moving average for a curve of n points: 0.5% of the run, at least 3
    (a 7-point window on the 200-step quick start, 191 points on a 19,000-step run: 1% of the plot's width). Wider
    windows smooth more but cut the corner where the loss stops falling fast."""
    return max(3, n // 200)


def smooth(values: list[float], half: int | None = None) -> list[float]:
    """Centred moving average: point i is the mean of points i - h .. i + h, h = `half` (default smooth_half_width)
    shrunk near either end to keep the window symmetric: the curve starts and ends at the data and a straight stretch
    stays put (a trailing average, debiased or not, lags a falling loss and starts above it)."""
    n = len(values)
    h = smooth_half_width(n) if half is None else half
    if h < 0:
        raise ValueError(f"half={h}: must be >= 0")
    prefix = [0.0, *itertools.accumulate(values)]
    halves = (min(h, i, n - 1 - i) for i in range(n))  # the window's half-width at point i
    return [(prefix[i + k + 1] - prefix[i - k]) / (2 * k + 1) for i, k in enumerate(halves)]


def write_plot_data(live_dir: str | Path, baselines: Mapping[str, Any], out_dir: str | Path,
                    final_acc_norm: Mapping[str, float] | None = None,
                    comparable: Mapping[str, bool] | None = None) -> list[Path]:
    """Write the files dvc.yaml's top-level plots read besides dvclive's (`live_dir`: dvclive's folder; `baselines`
    as read_baselines returns them); returns their paths. out_dir/baselines.tsv: step, tokens_seen, one column per
    reference figure and beside each `<figure>_comparable` (true where `comparable`, compare.comparable_figures' map,
    says so: the plots draw only those), at the run's first and last logged step. out_dir/<curve>.tsv: step,
    tokens_seen, <curve> for each of CURVES the run logged (an evaluation at step s has seen s steps of tokens, a
    training step s + 1); train_loss.tsv also has train_loss_smooth (`smooth`) beside the raw column.
    out_dir/acc_norm.tsv: step, tokens_seen, task, acc_norm: each task's curve logged in training (train.tasks),
    then `final_acc_norm` ({task: acc_norm} of evaluate's tasks) at the last step; absent if there is neither."""
    live_dir, out_dir = Path(live_dir), Path(out_dir)
    refs = baseline_values(dict(baselines))
    metrics_dir = live_dir / "plots" / "metrics"
    per_step = tokens_per_step(live_dir)
    written: list[Path] = []
    curves: dict[str, list[tuple[int, int, float]]] = {}  # name -> [(step, tokens_seen, value)]
    tasks = sorted(p.stem for p in metrics_dir.glob(f"*{ACC_NORM}.tsv"))  # each task of train.tasks
    for old in out_dir.glob(f"*{ACC_NORM}.tsv") if out_dir.is_dir() else ():
        if old.stem not in tasks:
            old.unlink()  # a task this run did not score in training: none may linger
    for name in (*CURVES, *tasks):
        src, dst = metrics_dir / f"{name}.tsv", out_dir / f"{name}.tsv"
        if not src.is_file():
            dst.unlink(missing_ok=True)  # not logged this run (say, HellaSwag on the quick start): none may linger
            continue
        done = 1 if name == "train_loss" else 0  # train_loss at step s is logged after that step's update
        rows = curves[name] = [(s, round((s + done) * per_step), v) for s, v in read_step_tsv(src)]
        if name == "train_loss":
            smoothed = smooth([v for _, _, v in rows])
            write_tsv(dst, ["step", "tokens_seen", name, f"{name}_smooth"],
                      ((s, t, v, round(m, 6)) for (s, t, v), m in zip(rows, smoothed)))
        else:
            write_tsv(dst, ["step", "tokens_seen", name], rows)
        written.append(dst)
    points = [(s, t) for rows in curves.values() for s, t, _ in rows]  # the reference lines' span
    if not points:
        raise UserError(f"{metrics_dir}: no train_loss.tsv or val_loss.tsv rows; run the train stage first")
    first, last = min(points), max(points)  # tokens_seen grows with the step
    acc_rows = [(s, t, name.removesuffix(ACC_NORM), v) for name in tasks for s, t, v in curves.get(name, [])]
    acc_rows += [(*last, task, value) for task, value in (final_acc_norm or {}).items()]
    acc = out_dir / "acc_norm.tsv"
    if acc_rows:
        write_tsv(acc, ["step", "tokens_seen", "task", "acc_norm"], acc_rows)
        written.append(acc)
    else:
        acc.unlink(missing_ok=True)
    judged = comparable or {}  # a figure compare did not call comparable is not drawn
    header = ["step", "tokens_seen", *(c for name in refs for c in (name, f"{name}_comparable"))]
    row = [c for name, value in refs.items() for c in (value, "true" if judged.get(name) else "false")]
    write_tsv(out_dir / "baselines.tsv", header, ([s, t, *row] for s, t in (first, last)))
    return [*written, out_dir / "baselines.tsv"]


# --- one colour per run (DVC's revision) on the whole page ---

# DVC's colours for revisions, given in the order it lists them: what its own plots (the per-metric ones) take, from
# a template's <DVC_METRIC_COLOR>. Ours take them too (.dvc/plots/: `"sort": null`, the revisions in the data's order,
# which is DVC's). DVC fills each plot apart, with the revisions that have data there, so a revision missing from one
# plot would shift the others' colours in it: the page and the files give every plot one scale, page_revisions'
# revisions over these colours.
RUN_COLORS = ("#945dd6", "#13adc7", "#f46837", "#48bb78", "#4299e1", "#ed8936", "#f56565")


def page_revisions(specs: Iterable[Mapping[str, Any]]) -> list[str]:
    """The revisions (`rev`) of the data of all these Vega-Lite specs, in DVC's order: as the plot holding the most of
    them lists them (DVC's data go revision by revision), then the others' as they come."""
    per_plot = [list(dict.fromkeys(row["rev"] for row in (spec.get("data") or {}).get("values") or []
                                   if isinstance(row, dict) and row.get("rev") is not None))
                for spec in specs]
    per_plot.sort(key=len, reverse=True)  # stable: among plots of as many revisions, page order
    return list(dict.fromkeys(rev for revs in per_plot for rev in revs))


def color_runs_alike(spec: Mapping[str, Any], revs: list[str]) -> dict[str, Any]:
    """A copy of `spec` whose every colour encoding by `rev` maps `revs` onto RUN_COLORS (the page does the same)."""
    scale = {"domain": list(revs), "range": [RUN_COLORS[i % len(RUN_COLORS)] for i in range(len(revs))]}

    def walk(node: Any, key: str = "") -> Any:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict) or key == "data":
            return node
        out = {k: walk(v, k) for k, v in node.items()}
        if key == "color" and out.get("field") == "rev":
            out["scale"] = {**scale}
        return out

    return walk(dict(spec))


# --- rendering DVC's plots to files ---

FORMATS = ("png", "svg", "html")


def plot_filename(name: str, fmt: str) -> str:
    """A plot id -> a file name: `loss` -> `loss.png`, `metrics/train/plots/metrics/lr.tsv` -> `metrics_..._lr.png`."""
    stem = re.sub(r"\.(tsv|csv|json|yaml)$", "", name)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "plot"
    return f"{stem}.{fmt}"


def render_plots(plots: Mapping[str, Any], out_dir: str | Path = PNG_DIR, fmt: str = "png", scale: float = 2.0,
                 log=print) -> list[Path]:  # noqa: ANN001
    """Render the Vega-Lite specs of `dvc plots show/diff --json` output to files in out_dir; returns them. DVC's load
    errors (a plot file missing in a revision) go to `log`, as `dvc plots show` does, and the rest of that plot is
    still drawn; a plot with no data at all is skipped."""
    if fmt not in FORMATS:
        raise UserError(f"format={fmt!r}: choose one of {', '.join(FORMATS)}")
    out_dir = Path(out_dir)
    for err in plots.get("errors", []):
        where = " ".join(str(err[k]) for k in ("rev", "source") if err.get(k))
        log(f"[plots] {err.get('name', 'plots')}: could not load {where}: {err.get('msg') or err.get('type')}")
    data = plots.get("data", {})
    if not data:
        raise UserError("no plots: dvc.yaml declares none, or DVC found none of their files")
    import vl_convert as vlc

    # html: Vega's JavaScript inlined, so the page opens offline, interactive like `dvc plots show`
    convert = {"png": lambda s: vlc.vegalite_to_png(s, scale=scale), "svg": lambda s: vlc.vegalite_to_svg(s).encode(),
               "html": lambda s: vlc.vegalite_to_html(s, bundle=True).encode()}
    written = []
    revs = page_revisions(r["content"] for rs in data.values() for r in rs if r.get("type") == "vega")
    for name, renderers in data.items():
        for i, r in enumerate(renderers):
            if r.get("type") != "vega":
                log(f"[plots] {name}: {r.get('type')} plot left out (only Vega plots are rendered)")
                continue
            spec = color_runs_alike(r["content"], revs)  # each run one colour in all files, as on the page
            if not spec.get("data", {}).get("values"):
                log(f"[plots] {name}: no data in any revision, skipped")
                continue
            # whole legend labels: DVC's series names are file::field and get cut at 160 px otherwise
            spec["config"] = {**spec.get("config", {}), "legend": {"labelLimit": 0}}
            path = out_dir / plot_filename(name if i == 0 else f"{name}_{i}", fmt)
            with atomic_write(path, "wb") as f:
                f.write(convert[fmt](spec))
            written.append(path)
    return written


# --- the offline page of `dvc plots show` ---

# .dvc/config's plots.html_template names this file (relative to .dvc/): DVC fills it with the plots instead of its
# own page, whose <script> tags fetch Vega from a CDN
OFFLINE_PAGE = Path("plots/offline.html")
# what DVC replaces in the page: its plots (required), a refresh tag and its CDN <script> tags, the last left out here
_DVC_PLACEHOLDERS = ("{plot_divs}", "{refresh_tag}", "{scripts}")
# Each of DVC's plot divs calls vegaEmbed as the page is parsed; the bundle runs after them (a module: deferred, and
# its top-level names cannot clash with the divs' `var spec`), so the calls wait in a queue, which it then draws.
_QUEUE = ("window.vegaEmbed = (el, spec, opt) => "
          "(window.gptcoreQueued = window.gptcoreQueued || []).push([el, spec, opt]);")
# Before drawing, every colour encoding by revision gets one scale, in the queued spec itself: the page's revisions
# (as page_revisions orders them) over RUN_COLORS, as color_runs_alike does for the files.
_SNIPPET = """\
window.vega = vega;
window.vegaLite = vegaLite;
const queued = window.gptcoreQueued || [];
const colors = @RUN_COLORS@;
const revsOf = (spec) => [...new Set(((spec.data || {}).values || []).map((row) => row && row.rev)
  .filter((rev) => rev != null))];
const revs = [...new Set(queued.map(([, spec]) => revsOf(spec)).sort((a, b) => b.length - a.length).flat())];
const scale = {domain: revs, range: revs.map((rev, i) => colors[i % colors.length])};
const recolor = (node, key) => {
  if (Array.isArray(node)) node.forEach((v) => recolor(v, ""));
  else if (node && typeof node === "object" && key !== "data") {
    for (const [k, v] of Object.entries(node)) recolor(v, k);
    if (key === "color" && node.field === "rev") node.scale = {domain: [...scale.domain], range: [...scale.range]};
  }
};
window.vegaEmbed = vegaEmbed;
for (const [el, spec, opt] of queued) {
  recolor(spec, "");
  vegaEmbed(el, spec, opt);
}
""".replace("@RUN_COLORS@", json.dumps(list(RUN_COLORS)))
_PAGE = """\
<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<!-- @MARKER@ -->
{refresh_tag}
<title>DVC plots</title>
<script>@QUEUE@</script>
<style>body { font-family: sans-serif; margin: 16px; } body > div { margin-bottom: 24px; }</style>
</head>
<body>
{plot_divs}
<script type="module">
@BUNDLE@
</script>
</body>
</html>
"""


def _page_marker() -> str:
    """The page's first comment: what wrote it, from which vl-convert; a page with another marker is rewritten."""
    from importlib.metadata import version

    digest = hashlib.sha256((_PAGE + _QUEUE + _SNIPPET).encode("utf-8")).hexdigest()[:12]
    return (f"gptcore offline page for dvc plots show/diff: Vega, Vega-Lite and vega-embed inlined from "
            f"vl-convert-python {version('vl-convert-python')}; page {digest}; written by the compare stage and "
            f"gptcore-render-plots --page")


@functools.cache  # bundling takes over a second, the same bundle each time for the vl-convert installed
def offline_page() -> str:
    """DVC's HTML template with Vega, Vega-Lite and vega-embed inlined (vl-convert's bundle): no network needed."""
    import vl_convert as vlc

    bundle = vlc.javascript_bundle(_SNIPPET)
    for placeholder in _DVC_PLACEHOLDERS:  # DVC would fill it inside the JavaScript
        if placeholder in bundle:
            raise RuntimeError(f"vl-convert's bundle holds {placeholder}, which DVC replaces in the page")
    bundle = re.sub(r"</(script)", r"<\\/\1", bundle, flags=re.IGNORECASE)  # inline: only this ends the element
    return _PAGE.replace("@MARKER@", _page_marker()).replace("@QUEUE@", _QUEUE).replace("@BUNDLE@", bundle)


def write_offline_page(path: str | Path = OFFLINE_PAGE) -> Path:
    """Write the page `dvc plots show` fills (see offline_page) unless `path` holds this very page already."""
    path = Path(path)
    if path.is_file():
        with open(path, encoding="utf-8", errors="replace") as f:
            if _page_marker() in f.read(1000):
                return path
    with atomic_write(path) as f:
        f.write(offline_page())
    return path


def read_plots_json(source: str) -> dict[str, Any]:
    """`dvc plots show/diff --json` output from a file, or from stdin when `source` is "-"."""
    if source == "-":
        if sys.stdin.isatty():
            raise UserError("no input: pipe in `dvc plots show --json` (or `dvc plots diff REV... --json`), "
                             "or name a file holding it")
        text, where = sys.stdin.read(), "stdin"
    else:
        try:
            text, where = Path(source).read_text(encoding="utf-8"), source
        except OSError as e:
            raise UserError(f"{source}: cannot read ({e.strerror})") from None
    try:
        plots = json.loads(text)
    except ValueError:
        raise UserError(f"{where}: not JSON; expected the output of `dvc plots show --json`") from None
    if not isinstance(plots, dict):
        raise UserError(f"{where}: expected the JSON object `dvc plots show --json` prints")
    check_plots_json(plots, where)
    return plots


def check_plots_json(plots: dict[str, Any], where: str) -> None:
    """A UserError naming `where` and the place of the first part of `plots` that is not of the shape `dvc plots
    show/diff --json` prints: {"errors": [{...}], "data": {plot id: [{"type", "content"}]}}, a Vega plot's content a
    Vega-Lite spec (a mapping) whose data values are a list of rows."""
    def bad(place: str, value: Any, want: str) -> UserError:
        got = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)
        return UserError(f"{where}: {place} is {got}, not {want}: expected what `dvc plots show --json` prints")

    errors, data = plots.get("errors"), plots.get("data")
    if not isinstance(errors, (list, type(None))) or not all(isinstance(e, dict) for e in errors or []):
        raise bad("errors", errors, "a list of mappings")
    if not isinstance(data, (dict, type(None))):
        raise bad("data", data, "a mapping of plot ids")
    for name, renderers in (data or {}).items():
        if not isinstance(renderers, list):
            raise bad(f"data[{name!r}]", renderers, "a list of plots")
        for i, r in enumerate(renderers):
            if not isinstance(r, dict):
                raise bad(f"data[{name!r}][{i}]", r, "a mapping")
            if r.get("type") != "vega":
                continue  # left out by render_plots, whatever its content
            content = r.get("content")
            if not isinstance(content, dict):
                raise bad(f"data[{name!r}][{i}].content", content, "a Vega-Lite spec (a mapping)")
            spec_data = content.get("data")
            if not isinstance(spec_data, (dict, type(None))):
                raise bad(f"data[{name!r}][{i}].content.data", spec_data, "a mapping")
            values = (spec_data or {}).get("values")
            if not isinstance(values, (list, type(None))):
                raise bad(f"data[{name!r}][{i}].content.data.values", values, "a list of rows")


def check_arguments(out: str, scale: float) -> None:
    """gptcore-render-plots' --out and --scale, before any input is read or drawn: a UserError naming the option."""
    if not math.isfinite(scale) or scale <= 0:
        raise UserError(f"--scale {scale}: must be a number > 0 (PNG pixels per Vega-Lite pixel, e.g. 2)")
    for folder in (Path(out), *Path(out).parents):
        if folder.exists():
            if not folder.is_dir():
                raise UserError(f"--out {out}: {folder} is a file, not a folder: name a folder for the images "
                                f"(it is made if missing)")
            break


def main(argv: list[str] | None = None) -> None:
    """gptcore-render-plots: `dvc plots show/diff --json` output in, one image file per plot out."""
    ap = argparse.ArgumentParser(
        prog="gptcore-render-plots",
        description="Render DVC's plots to image files without network: "
                    "dvc plots show --json | gptcore-render-plots (or dvc plots diff REV... --json | ...).")
    ap.add_argument("json", nargs="?", default="-", help="a file holding dvc's JSON (default: read stdin)")
    ap.add_argument("--out", default=str(PNG_DIR), help=f"output folder (default: {PNG_DIR})")
    ap.add_argument("--format", choices=FORMATS, default="png")
    ap.add_argument("--scale", type=float, default=2.0, help="PNG pixels per Vega-Lite pixel (default: 2)")
    ap.add_argument("--page", action="store_true",
                    help=f"write {OFFLINE_PAGE} instead (the page .dvc/config makes `dvc plots show` fill: Vega "
                         "inlined, drawn offline; the compare stage writes it too) and print its path")
    args = ap.parse_args(argv)
    with one_line_errors("gptcore-render-plots"):
        if args.page:  # into the DVC repository holding the current folder: the first one upwards with a .dvc/
            root = next((f for f in (Path.cwd(), *Path.cwd().parents) if (f / ".dvc").is_dir()), None)
            if root is None:
                raise UserError(f"{Path.cwd()}: not in a DVC repository (no .dvc/ folder here or above); run it in "
                                "the gptcore checkout")
            print(write_offline_page(root / OFFLINE_PAGE))
            return
        check_arguments(args.out, args.scale)
        plots = read_plots_json(args.json)
        files = render_plots(plots, args.out, args.format, args.scale, log=lambda m: print(m, file=sys.stderr))
    for path in files:
        print(path)


if __name__ == "__main__":
    main()
