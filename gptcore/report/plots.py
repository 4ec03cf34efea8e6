"""The plots: the compare stage's data beside the curves train keeps (gptcore/report/curves.py), the offline page `dvc
plots show` fills, runs drawn as one line named, and DVC's plots rendered to files with vl-convert (Vega-Lite compiled
and drawn locally: no browser, no network).

The library never runs DVC: you run it and pipe its JSON in (console script gptcore-render-plots):
    dvc plots show --json | gptcore-render-plots                       # the workspace's plots -> plots_png/*.png
    dvc plots diff exp-a1b2c exp-d3e4f --json | gptcore-render-plots  # two experiments, curves overlaid
    gptcore-render-plots --page                                        # plots/offline.html, where compare has not run
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from gptcore.atomic import atomic_write
from gptcore.errors import UserError, one_line_errors
from gptcore.report.baselines import baseline_values
from gptcore.report.curves import CHANCE, run_span, step_metrics
from gptcore.report.steplog import write_tsv

PNG_DIR = Path("plots_png")
FINAL_ACC = "final_acc_norm.tsv"  # the evaluate stage's final scores on the accuracy plot
BASELINES = "baselines.tsv"


# --- plot data (the compare stage; the curves beside it are the train stage's, gptcore/report/curves.py) ---

def write_plot_data(live_dir: str | Path, baselines: Mapping[str, Any], out_dir: str | Path,
                    final_acc_norm: Mapping[str, float] | None = None,
                    comparable: Mapping[str, bool] | None = None) -> list[Path]:
    """Write what dvc.yaml's top-level plots read besides the run's curves (the train stage writes those beside them,
    gptcore/report/curves.py; `live_dir`: dvclive's folder; `baselines` as read_baselines returns them); returns the
    paths. out_dir/
    baselines.tsv: step, tokens_seen, one column per reference figure and beside each `<figure>_comparable` (true
    where `comparable`, compare.comparable_figures' map, says so: the plots draw only those), at the run's first and
    last logged step. out_dir/final_acc_norm.tsv: step, tokens_seen, task, acc_norm, chance: `final_acc_norm`
    ({task: acc_norm} of evaluate's tasks) at the run's last step, beside the score of a guess (curves.CHANCE); a
    header alone without scores."""
    out_dir = Path(out_dir)
    refs = baseline_values(dict(baselines))
    span = run_span(live_dir)
    if span is None:
        raise UserError(f"{step_metrics(live_dir)}: no train_loss.tsv or val_loss.tsv rows; run the train stage first")
    first, last = span
    written: list[Path] = []
    write_tsv(out_dir / FINAL_ACC, ["step", "tokens_seen", "task", "acc_norm", "chance"],
              ((*last, task, value, CHANCE) for task, value in (final_acc_norm or {}).items()))
    written.append(out_dir / FINAL_ACC)
    judged = comparable or {}  # a figure compare did not call comparable is not drawn
    header = ["step", "tokens_seen", *(c for name in refs for c in (name, f"{name}_comparable"))]
    row = [c for name, value in refs.items() for c in (value, "true" if judged.get(name) else "false")]
    write_tsv(out_dir / BASELINES, header, ([s, t, *row] for s, t in (first, last)))
    written.append(out_dir / BASELINES)
    return written


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


# --- runs drawn as one ---

_NOT_DRAWN = ("rev", "filename")  # what tells two runs' rows apart without moving a line


def coinciding_runs(spec: Mapping[str, Any]) -> list[list[str]]:
    """The groups of two or more revisions whose data in this Vega-Lite spec are the same row for row, but for the
    revision and the file DVC read them from (a workspace bit-identical to HEAD, a rerun that reproduced its run, a
    run committed before its files moved): their lines lie on top of each other, the last drawn hiding the others."""
    rows: dict[str, list[str]] = {}
    for row in (spec.get("data") or {}).get("values") or []:
        if isinstance(row, dict) and row.get("rev") is not None:
            same = {k: v for k, v in row.items() if k not in _NOT_DRAWN}
            rows.setdefault(str(row["rev"]), []).append(json.dumps(same, sort_keys=True))
    groups: dict[tuple[str, ...], list[str]] = {}
    for rev, data in rows.items():
        groups.setdefault(tuple(sorted(data)), []).append(rev)
    return [revs for revs in groups.values() if len(revs) > 1]


def coinciding_note(revs: list[str]) -> str:
    """The subtitle line for one group of coinciding_runs (the page writes the same)."""
    names = revs[0] if len(revs) == 1 else f"{', '.join(revs[:-1])} and {revs[-1]}"
    return f"{names}: the same data, drawn as one line"


def note_coinciding(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `spec` whose title gets a subtitle line for each group of coinciding_runs: one colour would hide the
    other runs of its group without a word (the page does the same)."""
    groups = coinciding_runs(spec)
    if not groups:
        return dict(spec)
    title = spec.get("title")
    title = {"text": title} if isinstance(title, str) else dict(title or {"text": ""})
    old = title.get("subtitle")
    title["subtitle"] = ([] if old is None else [old] if isinstance(old, str) else list(old)) + [
        coinciding_note(g) for g in groups]
    return {**spec, "title": title}


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
            # each run one colour in all files, as on the page; runs drawn as one line say so
            spec = note_coinciding(color_runs_alike(r["content"], revs))
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
// revisions whose rows are the same but for `rev` and `filename` draw as one line: a subtitle says so (as
// note_coinciding does)
const canon = (row) => JSON.stringify(Object.keys(row).filter((k) => k !== "rev" && k !== "filename").sort()
  .map((k) => [k, row[k]]));
const noteCoinciding = (spec) => {
  const byRev = new Map();
  for (const row of ((spec.data || {}).values || [])) {
    if (!row || row.rev == null) continue;
    const rev = String(row.rev);
    if (!byRev.has(rev)) byRev.set(rev, []);
    byRev.get(rev).push(canon(row));
  }
  const groups = new Map();
  for (const [rev, rows] of byRev) {
    const key = JSON.stringify(rows.sort());
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(rev);
  }
  const notes = [...groups.values()].filter((g) => g.length > 1).map((g) =>
    (g.length === 1 ? g[0] : g.slice(0, -1).join(", ") + " and " + g[g.length - 1]) +
    ": the same data, drawn as one line");
  if (!notes.length) return;
  const title = typeof spec.title === "string" ? {text: spec.title} : {...(spec.title || {text: ""})};
  const old = title.subtitle;
  title.subtitle = (old == null ? [] : Array.isArray(old) ? [...old] : [old]).concat(notes);
  spec.title = title;
};
window.vegaEmbed = vegaEmbed;
for (const [el, spec, opt] of queued) {
  recolor(spec, "");
  noteCoinciding(spec);
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
