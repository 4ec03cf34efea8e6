"""gptcore.report.plots and baselines: the plot data the compare stage writes, dvc.yaml's plot definitions, \
offline rendering."""
import html as html_module
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable

import pytest
import yaml

from gptcore.errors import UserError
from gptcore.report import curves, plots
from gptcore.report.baselines import baseline_values, read_baselines
from gptcore.report.compare import comparable_figures
from gptcore.report.steplog import read_step_tsv
from stages.compare import LIVE_DIR, PLOT_DATA

ROOT = Path(__file__).resolve().parents[1]
_ON = yaml.safe_load((ROOT / "conf" / "baselines.yaml").read_text(encoding="utf-8"))["gpt2_124m"]
BASELINES = {"gpt2_124m": {"val_loss": 3.2924, "val_loss_measured_on": _ON["val_loss_measured_on"],
                           "hellaswag_acc_norm": 0.2955,
                           "hellaswag_acc_norm_measured_on": _ON["hellaswag_acc_norm_measured_on"]},
             "gpt3_124m": {"hellaswag_acc_norm": 0.337,
                           "hellaswag_acc_norm_measured_on": _ON["hellaswag_acc_norm_measured_on"]}}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_live(live: Path, name: str, rows: list[tuple[int, float]]) -> None:
    """A dvclive step TSV as the train stage leaves it."""
    d = live / "plots" / "metrics"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.tsv").write_text(f"step\t{name}\n" + "".join(f"{s}\t{v}\n" for s, v in rows), encoding="utf-8")


def read_tsv(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()]


def fake_run(live: Path, steps: int = 10, tokens: int = 256, eval_every: int = 5) -> None:
    """What a run of `steps` steps of `tokens` tokens logs: train rows 0..steps-1, evals at 0, 5, ..., steps."""
    write_live(live, "train_loss", [(s, 10.0 - s * 0.5) for s in range(steps)])
    write_live(live, "tokens_seen", [(s, (s + 1) * tokens) for s in range(steps)])
    write_live(live, "val_loss", [(s, 10.0 - s * 0.4) for s in range(0, steps + 1, eval_every)])


def test_curves_tokens_and_baseline_span(tmp_path):
    live, out = tmp_path / "metrics" / "train", tmp_path / "metrics" / "plots"
    fake_run(live)
    assert [p.name for p in curves.write_curves(live, out)] == ["train_loss.tsv", "val_loss.tsv", "acc_norm.tsv"]
    assert [p.name for p in plots.write_plot_data(live, BASELINES, out)] == ["final_acc_norm.tsv", "baselines.tsv"]

    train = read_tsv(out / "train_loss.tsv")
    assert train[0] == ["step", "tokens_seen", "train_loss", "train_loss_smooth"]
    # a training step s has consumed s + 1 batches ...
    assert [(int(s), int(t)) for s, t, _, _ in train[1:]] == [(s, (s + 1) * 256) for s in range(10)]
    # the raw loss is kept; its centred moving average leaves a straight stretch where it is (no lag)
    assert [float(r[2]) for r in train[1:]] == [10.0 - s * 0.5 for s in range(10)]
    assert [float(r[3]) for r in train[1:]] == pytest.approx([10.0 - s * 0.5 for s in range(10)])
    # ... an evaluation at step s runs before that step's update
    val = read_tsv(out / "val_loss.tsv")
    assert [(int(s), int(t)) for s, t, _ in val[1:]] == [(0, 0), (5, 1280), (10, 2560)]
    assert float(val[-1][2]) == pytest.approx(6.0)
    # no task scored in training, none at the end: headers alone, so DVC finds the files
    assert read_tsv(out / "acc_norm.tsv") == [["step", "tokens_seen", "task", "acc_norm", "chance"]]
    assert read_tsv(out / "final_acc_norm.tsv") == [["step", "tokens_seen", "task", "acc_norm", "chance"]]

    base = read_tsv(out / "baselines.tsv")
    assert base[0] == ["step", "tokens_seen", "gpt2_124m_val_loss", "gpt2_124m_val_loss_comparable",
                       "gpt2_124m_hellaswag_acc_norm", "gpt2_124m_hellaswag_acc_norm_comparable",
                       "gpt3_124m_hellaswag_acc_norm", "gpt3_124m_hellaswag_acc_norm_comparable"]
    # two rows spanning the run: a horizontal line from the first to the last logged step and token count
    assert [(int(r[0]), int(r[1])) for r in base[1:]] == [(0, 0), (10, 2560)]
    # no comparability given: no reference is marked comparable, so the plots draw none
    assert base[1][2:] == ["3.2924", "false", "0.2955", "false", "0.337", "false"]
    assert base[1][2:] == base[2][2:]


def test_accuracy_curves_final_scores_chance_and_the_next_run(tmp_path):
    live, out = tmp_path / "train", tmp_path / "plots"
    fake_run(live)
    write_live(live, "hellaswag_acc_norm", [(0, 0.25), (5, 0.26), (10, 0.27)])
    curves.write_curves(live, out)
    # the accuracy plot's data: the training curve (the train stage's), each row with the score of a guess ...
    assert read_tsv(out / "acc_norm.tsv")[1:] == [
        ["0", "0", "hellaswag", "0.25", "0.25"], ["5", "1280", "hellaswag", "0.26", "0.25"],
        ["10", "2560", "hellaswag", "0.27", "0.25"]]
    # ... then the evaluate stage's final score at the last step (compare's)
    plots.write_plot_data(live, BASELINES, out, {"hellaswag": 0.28})
    assert read_tsv(out / "final_acc_norm.tsv")[1:] == [["10", "2560", "hellaswag", "0.28", "0.25"]]

    # the next run logs no HellaSwag: its curve must not survive from the run before; a cloze run gets its point
    (live / "plots" / "metrics" / "hellaswag_acc_norm.tsv").unlink()
    curves.write_curves(live, out)
    plots.write_plot_data(live, BASELINES, out, {"cloze": 0.4})
    assert read_tsv(out / "acc_norm.tsv")[1:] == []
    assert read_tsv(out / "final_acc_norm.tsv")[1:] == [["10", "2560", "cloze", "0.4", "0.25"]]
    assert sorted(p.name for p in out.iterdir()) == ["acc_norm.tsv", "baselines.tsv", "final_acc_norm.tsv",
                                                     "train_loss.tsv", "val_loss.tsv"]  # no temp file left


def test_curves_without_training_steps(tmp_path):
    """train.max_steps 0 (the OpenAI baseline preset): one val point at step 0, no tokens_seen.tsv."""
    live, out = tmp_path / "train", tmp_path / "plots"
    write_live(live, "val_loss", [(0, 3.29)])
    curves.write_curves(live, out)
    plots.write_plot_data(live, BASELINES, out)
    assert read_tsv(out / "val_loss.tsv")[1:] == [["0", "0", "3.29"]]
    assert read_tsv(out / "train_loss.tsv")[1:] == []
    assert [r[:2] for r in read_tsv(out / "baselines.tsv")[1:]] == [["0", "0"], ["0", "0"]]


def test_plot_data_reads_the_repository_baselines(tmp_path):
    fake_run(tmp_path / "train")
    plots.write_plot_data(tmp_path / "train", read_baselines(ROOT / "conf" / "baselines.yaml"), tmp_path / "plots")
    figures = yaml.safe_load((ROOT / "conf" / "baselines.yaml").read_text(encoding="utf-8"))
    row = read_tsv(tmp_path / "plots" / "baselines.tsv")[1]
    assert float(row[2]) == figures["gpt2_124m"]["val_loss"]
    assert float(row[6]) == figures["gpt3_124m"]["hellaswag_acc_norm"]


def test_plot_data_bad_input(tmp_path):
    with pytest.raises(UserError, match="run the train stage first"):
        plots.write_plot_data(tmp_path / "nothing", BASELINES, tmp_path / "plots")
    live = tmp_path / "train"
    fake_run(live)
    (live / "plots" / "metrics" / "val_loss.tsv").write_text("step\tval_loss\n0\tnan-ish\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"val_loss\.tsv: line 2"):
        plots.write_plot_data(live, BASELINES, tmp_path / "plots")
    with pytest.raises(UserError, match=r"val_loss\.tsv: line 2"):
        curves.write_curves(live, tmp_path / "plots")
    fake_run(live)
    with pytest.raises(UserError, match="gpt2_124m needs numeric hellaswag_acc_norm"):
        plots.write_plot_data(live, {"gpt2_124m": {"val_loss": 3.3}}, tmp_path / "plots")
    with pytest.raises(UserError, match="gpt3_124m.hellaswag_acc_norm must be a finite number, got 'n/a'"):
        plots.write_plot_data(live, {**BASELINES, "gpt3_124m": {"hellaswag_acc_norm": "n/a"}}, tmp_path / "plots")


def test_dvc_yaml_plots_read_what_is_written():
    """Every series of dvc.yaml's top-level plots names a column its file really has (dvclive's or ours)."""
    dvc_yaml = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    defs = {k: v for d in dvc_yaml["plots"] for k, v in d.items()}
    assert {"loss", "loss_vs_tokens", "val_loss_vs_tokens_log", "acc_norm"} <= set(defs)
    refs = baseline_values(read_baselines(ROOT / "conf" / "baselines.yaml"))  # compare writes a column for each
    # the compare stage's files and the train stage's, side by side
    ours = {PLOT_DATA / "baselines.tsv": {"step", "tokens_seen", *refs, *(f"{name}_comparable" for name in refs)},
            PLOT_DATA / "final_acc_norm.tsv": {"step", "tokens_seen", "task", "acc_norm", "chance"},
            PLOT_DATA / "train_loss.tsv": {"step", "tokens_seen", "train_loss", "train_loss_smooth"},
            PLOT_DATA / "val_loss.tsv": {"step", "tokens_seen", "val_loss"},
            PLOT_DATA / "acc_norm.tsv": {"step", "tokens_seen", "task", "acc_norm", "chance"}}
    live = LIVE_DIR / "plots" / "metrics"
    for name, d in defs.items():
        for path, fields in d["y"].items():
            path = Path(path)
            fields = [fields] if isinstance(fields, str) else fields
            if path.parent == live:  # dvclive: step and the metric named like the file
                columns = {"step", path.stem}
            else:
                assert path in ours, f"plot {name}: {path} is neither dvclive's nor ours"
                columns = ours[path]
                # the committed run's file has them too: DVC drops a revision from a plot for one missing column
                committed = set(read_tsv(ROOT / path)[0])
                assert set(fields) <= committed, f"plot {name}: committed {path} lacks {set(fields) - committed}"
            assert d["x"] in columns and set(fields) <= columns, f"plot {name}: {path} has columns {columns}"
    # the reference lines are in each plot; the templates are the project's (.dvc/plots/)
    for name in ("loss", "loss_vs_tokens", "val_loss_vs_tokens_log"):
        assert "gpt2_124m_val_loss" in defs[name]["y"]["metrics/plots/baselines.tsv"]
    assert defs["loss_vs_tokens"]["x"] == defs["val_loss_vs_tokens_log"]["x"] == "tokens_seen"
    assert set(defs["acc_norm"]["y"]["metrics/plots/baselines.tsv"]) == {  # each size's published HellaSwag
        f"{entry}_hellaswag_acc_norm" for entry in ("gpt2_124m", "gpt3_124m", "gpt2_350m", "gpt2_774m", "gpt2_1558m")}
    for d in defs.values():
        assert (ROOT / ".dvc" / "plots" / f"{d['template']}.json").is_file()


def dvc_like_output(rows: list[dict], errors: list[dict] | None = None) -> dict:
    """The shape of `dvc plots show --json`: {"errors": [...], "data": {plot id: [{"type", "content"}]}}."""
    spec = {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "data": {"values": rows},
            "width": 200, "height": 120, "mark": "line",
            "encoding": {"x": {"field": "step", "type": "quantitative"},
                         "y": {"field": "dvc_inferred_y_value", "type": "quantitative"},
                         "color": {"field": "rev", "type": "nominal"}}}
    return {"errors": errors or [], "data": {"loss": [{"type": "vega", "revisions": ["a"], "content": spec}]}}


ROWS = [{"step": str(s), "dvc_inferred_y_value": str(5 - s / 4), "rev": rev} for rev in ("a", "b") for s in range(8)]


@pytest.mark.parametrize("fmt,head", [("png", PNG_MAGIC), ("svg", b"<svg"), ("html", b"<!DOCTYPE html>")])
def test_render_formats(tmp_path, fmt, head):
    files = plots.render_plots(dvc_like_output(ROWS), tmp_path / "out", fmt=fmt, log=lambda m: None)
    assert files == [tmp_path / "out" / f"loss.{fmt}"]
    data = files[0].read_bytes()
    assert data.lstrip()[: len(head)].lower() == head.lower()
    if fmt == "png":  # width from the IHDR chunk: 200 px plus axes and legend, at scale 2
        assert int.from_bytes(data[16:20], "big") > 400 and len(data) > 5000
    if fmt == "html":  # Vega inlined, nothing fetched from a CDN
        assert b"cdn.jsdelivr" not in data and b"vega" in data


def test_render_reports_errors_and_skips_empty(tmp_path):
    out = dvc_like_output(ROWS, errors=[{"name": "loss", "rev": "b", "source": "metrics/x.tsv", "msg": "missing"}])
    out["data"]["empty"] = [{"type": "vega", "content": {"data": {"values": []}, "mark": "line"}}]
    out["data"]["photo.png"] = [{"type": "image", "content": "photo.png"}]
    logged: list[str] = []
    files = plots.render_plots(out, tmp_path, log=logged.append)
    assert [f.name for f in files] == ["loss.png"]
    assert any("could not load b metrics/x.tsv: missing" in m for m in logged)
    assert any(m.startswith("[plots] empty: no data") for m in logged)
    assert any("photo.png: image plot left out" in m for m in logged)
    with pytest.raises(UserError, match="no plots"):
        plots.render_plots({"errors": [], "data": {}}, tmp_path)
    with pytest.raises(UserError, match="format='gif'"):
        plots.render_plots(out, tmp_path, fmt="gif")


def test_plot_filename():
    assert plots.plot_filename("loss", "png") == "loss.png"
    assert plots.plot_filename("metrics/train/plots/metrics/lr.tsv", "svg") == "metrics_train_plots_metrics_lr.svg"
    assert plots.plot_filename("../..", "png") == "plot.png"


def test_cli_reads_dvc_json_from_a_file_or_stdin(tmp_path, monkeypatch, capsys):
    (tmp_path / "plots.json").write_text(json.dumps(dvc_like_output(ROWS)), encoding="utf-8")
    plots.main([str(tmp_path / "plots.json"), "--out", str(tmp_path / "a")])
    assert (tmp_path / "a" / "loss.png").read_bytes().startswith(PNG_MAGIC)
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(dvc_like_output(ROWS))))
    plots.main(["--out", str(tmp_path / "b"), "--format", "svg"])
    assert capsys.readouterr().out.split() == [str(tmp_path / "a" / "loss.png"), str(tmp_path / "b" / "loss.svg")]


def test_cli_bad_input_exits_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO('{"errors": [], "data": {}}'))
    with pytest.raises(SystemExit, match=r"\[gptcore-render-plots\] no plots"):
        plots.main(["--out", str(tmp_path / "png")])
    (tmp_path / "x.json").write_text("Running stage...", encoding="utf-8")
    with pytest.raises(SystemExit, match="x.json: not JSON; expected the output of `dvc plots show --json`"):
        plots.main([str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="nope.json: cannot read"):
        plots.main([str(tmp_path / "nope.json")])
    assert not (tmp_path / "png").exists()


@pytest.mark.parametrize("args, says", [
    (["--scale", "0"], "--scale 0.0: must be a number > 0"),
    (["--scale", "-1"], "--scale -1.0: must be a number > 0"),
    (["--scale", "nan"], "--scale nan: must be a number > 0"),
    (["--out", "a_file"], "--out a_file: a_file is a file, not a folder"),
    (["--out", "a_file/png"], "--out a_file/png: a_file is a file, not a folder"),
])
def test_cli_bad_argument_is_one_line_before_anything_is_drawn(tmp_path, monkeypatch, args, says):
    """--scale 0 was vl-convert's ValueError after the rendering work; --out naming a file, a FileExistsError."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("mine\n")
    (tmp_path / "plots.json").write_text(json.dumps(dvc_like_output(ROWS)), encoding="utf-8")
    monkeypatch.setattr(plots, "render_plots", lambda *a, **k: pytest.fail("drew before checking its arguments"))
    with pytest.raises(SystemExit) as e:
        plots.main(["plots.json", *args])
    assert str(e.value.code).startswith(f"[gptcore-render-plots] {says}") and "\n" not in str(e.value.code)
    assert (tmp_path / "a_file").read_text() == "mine\n"


def _vega(content) -> dict:
    return {"errors": [], "data": {"loss": [{"type": "vega", "content": content}]}}


@pytest.mark.parametrize("doc, says", [
    (_vega("a spec as a string"), "data['loss'][0].content is a string, not a Vega-Lite spec (a mapping)"),
    (_vega({"data": "rows", "mark": "line"}), "data['loss'][0].content.data is a string, not a mapping"),
    (_vega({"data": {"values": {"step": 1}}}), "data['loss'][0].content.data.values is a mapping, not a list of rows"),
    ({"data": {"loss": {"type": "vega"}}}, "data['loss'] is a mapping, not a list of plots"),
    ({"data": {"loss": ["vega"]}}, "data['loss'][0] is a string, not a mapping"),
    ({"data": 5}, "data is a number, not a mapping of plot ids"),
    ({"errors": "none", "data": {}}, "errors is a string, not a list of mappings"),
])
def test_cli_json_of_another_shape_is_one_line_naming_the_place(tmp_path, doc, says):
    """A Vega plot whose content was a string was an AttributeError traceback."""
    (tmp_path / "plots.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        plots.main([str(tmp_path / "plots.json"), "--out", str(tmp_path / "png")])
    assert str(e.value.code) == (f"[gptcore-render-plots] {tmp_path / 'plots.json'}: {says}: expected what `dvc "
                                 f"plots show --json` prints")
    assert not (tmp_path / "png").exists()


# GPT-2 350M, 774M and 1558M (conf/baselines.yaml: llm.c's and build-nanogpt's HellaSwag figures)
FAMILY_HELLASWAG = {"gpt2_350m_hellaswag_acc_norm": 0.375224, "gpt2_774m_hellaswag_acc_norm": 0.431986,
                    "gpt2_1558m_hellaswag_acc_norm": 0.4893}


def test_baselines_file_is_checked_and_named(tmp_path):
    figures = read_baselines(ROOT / "conf" / "baselines.yaml")
    assert baseline_values(figures) == {"gpt2_124m_val_loss": 3.2924, "gpt2_124m_hellaswag_acc_norm": 0.2955,
                                        "gpt3_124m_hellaswag_acc_norm": 0.337, **FAMILY_HELLASWAG}
    (tmp_path / "b.yaml").write_text("gpt2_124m: {val_loss: 3.0}\n", encoding="utf-8")
    with pytest.raises(UserError, match="b.yaml: gpt2_124m needs numeric hellaswag_acc_norm"):
        read_baselines(tmp_path / "b.yaml")
    bad = yaml.safe_load((ROOT / "conf" / "baselines.yaml").read_text(encoding="utf-8"))
    bad["gpt2_350m"]["shape"]["n_layer"] = "24"
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(bad), encoding="utf-8")
    with pytest.raises(UserError, match="gpt2_350m.shape must give the model's n_layer, n_head and n_embd"):
        read_baselines(tmp_path / "b.yaml")


QUICKSTART_LIVE = ROOT / "metrics" / "train"  # the committed quick-start run's dvclive curves (200 steps)


def test_smooth_is_a_centred_moving_average():
    assert curves.smooth([4.0] * 5) == pytest.approx([4.0] * 5)
    # the window shrinks symmetrically at either end: the first and last points are the data's own
    assert curves.smooth([1.0, 2.0, 6.0, 4.0, 5.0], half=1) == pytest.approx([1.0, 3.0, 4.0, 5.0, 5.0])
    # a straight stretch stays where it is: no lag behind a falling loss, as a trailing average has
    line = [10.0 - 0.1 * s for s in range(50)]
    assert curves.smooth(line) == pytest.approx(line)
    # and it smooths: alternating noise of +-0.3 around a constant is averaged away inside the curve
    noisy = [5.0 + (0.3 if s % 2 else -0.3) for s in range(60)]
    assert all(abs(m - 5.0) < 0.05 for m in curves.smooth(noisy)[3:-3])
    assert curves.smooth_half_width(200) == 3 and curves.smooth_half_width(19_000) == 95
    assert curves.smooth([]) == []


def test_smoothed_train_loss_follows_the_quick_start_curve(tmp_path):
    """The committed quick start falls from 10.8 to 6.7 in 20 steps; the smoothed curve of the plots followed 1.6 nats
    above it there (a trailing average's lag: step 20 raw 6.70, smoothed 8.28, above the raw loss of the 3 steps
    before). Centred, each smoothed point lies among the raw losses of the steps around it."""
    curves.write_curves(QUICKSTART_LIVE, tmp_path)
    rows = read_tsv(tmp_path / "train_loss.tsv")[1:]
    raw, smoothed = [float(r[2]) for r in rows], [float(r[3]) for r in rows]
    assert len(raw) == 200 and smoothed[0] == pytest.approx(raw[0])
    for i, m in enumerate(smoothed):
        near = raw[max(0, i - 3): i + 4]
        assert min(near) - 1e-6 <= m <= max(near) + 1e-6, (i, m, near)
    assert abs(smoothed[20] - raw[20]) < 0.3, (raw[20], smoothed[20])


def summary_with(val_loss: bool, hellaswag: bool) -> dict:
    """summarize's `comparable` section as compare computes it (reasons where not comparable)."""
    def entry(name: str, ok: bool) -> dict:
        return {"baseline": name, "comparable": ok, **({} if ok else {"reason": "the run's val split differs"})}
    return {"val_loss_vs_gpt2": entry("gpt2_124m", val_loss),
            "hellaswag_acc_norm_vs_gpt2": entry("gpt2_124m", hellaswag),
            "hellaswag_acc_norm_vs_gpt3": entry("gpt3_124m", hellaswag),
            "lm_eval_hellaswag_acc_norm_vs_gpt2": entry("gpt2_124m", True)}


def test_comparable_figures_names_the_baselines_columns(tmp_path):
    # the committed quick start (Shakespeare, cloze): compare calls nothing comparable (metrics/comparison.json)
    committed = json.loads((ROOT / "metrics" / "comparison.json").read_text(encoding="utf-8"))["comparable"]
    assert comparable_figures(committed) == {
        "gpt2_124m_val_loss": False, "gpt2_124m_hellaswag_acc_norm": False, "gpt3_124m_hellaswag_acc_norm": False}
    judged = comparable_figures(summary_with(True, False))
    assert judged == {"gpt2_124m_val_loss": True, "gpt2_124m_hellaswag_acc_norm": False,
                      "gpt3_124m_hellaswag_acc_norm": False}
    fake_run(tmp_path / "train")
    plots.write_plot_data(tmp_path / "train", BASELINES, tmp_path / "plots", comparable=judged)
    assert read_tsv(tmp_path / "plots" / "baselines.tsv")[1][2:] == ["3.2924", "true", "0.2955", "false",
                                                                     "0.337", "false"]
    assert comparable_figures(summary_with(False, True)) == {
        "gpt2_124m_val_loss": False, "gpt2_124m_hellaswag_acc_norm": True, "gpt3_124m_hellaswag_acc_norm": True}


# ---------------------------------------------------------------------------------------------
# dvc.yaml's plots as DVC fills their templates and Vega draws them

GREY = "#555555"  # the templates' reference lines


def dvc(repo: Path, *args: str) -> str:
    """A dvc command in `repo` (the venv's dvc, this checkout's code); its stdout, or a failure showing both streams."""
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, f"dvc {' '.join(args)} (exit {proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def shifted_live(src: Path, dst: Path, shift: float) -> Path:
    """A copy of dvclive's curves in `src` with both losses moved by `shift` nats (another run of the same length)."""
    for name in ("tokens_seen", "train_loss", "val_loss"):
        rows = read_step_tsv(src / "plots" / "metrics" / f"{name}.tsv")
        write_live(dst, name, rows if name == "tokens_seen" else [(s, v + shift) for s, v in rows])
    return dst


def plots_repo(repo: Path) -> None:
    """An empty git repository with this checkout's plot definitions: dvc.yaml's top-level plots, and the train stage
    with its dvclive plots (DVC's per-metric plots, drawn with DVC's own template), .dvc/plots/, .dvc/config."""
    (repo / ".dvc").mkdir(parents=True)
    shutil.copy(ROOT / ".dvc" / "config", repo / ".dvc" / "config")
    shutil.copytree(ROOT / ".dvc" / "plots", repo / ".dvc" / "plots")
    dvc_yaml = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    train = {"cmd": dvc_yaml["stages"]["train"]["cmd"], "plots": dvc_yaml["stages"]["train"]["plots"]}
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": train}, "plots": dvc_yaml["plots"]},
                                                  sort_keys=False), encoding="utf-8")
    (repo / ".gitignore").write_text((ROOT / ".gitignore").read_text(encoding="utf-8"), encoding="utf-8")
    git(repo, "init", "-q")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True, timeout=60)


def commit_run(repo: Path, tag: str, live: Path, cloze: float, comparable: bool, extra: Iterable[str] = ()) -> None:
    """The run whose dvclive curves are in `live` committed to `repo` and tagged: its dvclive folder (the per-metric
    plots) and the compare stage's plot data, comparable with GPT-2 124M's val loss or not; `extra`: dvclive metrics
    it logs besides (a flat curve each), which the other runs lack."""
    for name in extra:
        write_live(live, name, [(s, 0.5) for s in range(0, 200, 10)])
    judged = {"gpt2_124m_val_loss": comparable, "gpt2_124m_hellaswag_acc_norm": False,
              "gpt3_124m_hellaswag_acc_norm": False}
    curves.write_curves(live, repo / PLOT_DATA)
    plots.write_plot_data(live, read_baselines(ROOT / "conf" / "baselines.yaml"), repo / PLOT_DATA,
                          {"cloze": cloze}, judged)
    shutil.rmtree(repo / LIVE_DIR, ignore_errors=True)
    shutil.copytree(live / "plots", repo / LIVE_DIR / "plots")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", tag)
    git(repo, "tag", tag)


@pytest.fixture(scope="module")
def two_run_repo(tmp_path_factory) -> Path:
    """A git repository with this checkout's plot definitions (plots_repo) and two runs, committed and tagged
    (commit_run): `base`, the committed quick start, comparable with no baseline (as compare says of it); `lower`, the
    same 0.3 nats lower, comparable with GPT-2 124M's val loss, and with a learning-rate curve `base` lacks."""
    tmp = tmp_path_factory.mktemp("plots")
    repo = tmp / "repo"
    plots_repo(repo)
    commit_run(repo, "base", shifted_live(QUICKSTART_LIVE, tmp / "base", 0.0), 0.288, False)
    commit_run(repo, "lower", shifted_live(QUICKSTART_LIVE, tmp / "lower", -0.3), 0.301, True, extra=["lr"])
    return repo


@pytest.fixture(scope="module")
def two_runs_specs(two_run_repo) -> dict[str, dict]:
    """{plot id: the Vega-Lite spec DVC filled} of `dvc plots diff base lower --json`."""
    diff = json.loads(dvc(two_run_repo, "plots", "diff", "base", "lower", "--json"))
    assert not diff.get("errors"), diff["errors"]
    return {name: renderers[0]["content"] for name, renderers in diff["data"].items()}


def drawn(spec: dict) -> list[dict]:
    """What Vega draws for `spec` (vl-convert's scenegraph): one entry per mark, {"type", "role", "items"}, each item
    with its x, y (x2, y2 for rules) in the plot's pixels, stroke, strokeDash, opacity, strokeWidth, text, ..."""
    import vl_convert as vlc

    out: list[dict] = []

    def walk(mark: dict, dx: float, dy: float) -> None:
        items = []
        for item in mark.get("items", []):
            at = {k: v + (dx if k in ("x", "x2") else dy) for k, v in item.items() if k in ("x", "x2", "y", "y2")}
            items.append({**item, **at})
            if mark.get("marktype") == "group":
                for sub in item.get("items", []):
                    walk(sub, dx + item.get("x", 0), dy + item.get("y", 0))
        out.append({"type": mark.get("marktype"), "role": mark.get("role"), "items": items})

    walk(vlc.vegalite_to_scenegraph(spec)["scenegraph"], 0.0, 0.0)
    return out


def curve_lines(marks: list[dict]) -> list[dict]:
    """The line marks of the runs' curves (not the grey references), each {"stroke", "dash", "opacity", "width",
    "xs", "ys"}: one per line drawn."""
    lines = [m for m in marks if m["type"] == "line" and m["role"] == "mark" and m["items"]]
    return [{"stroke": m["items"][0].get("stroke"), "dash": tuple(m["items"][0].get("strokeDash") or ()),
             "opacity": m["items"][0].get("opacity", 1), "width": m["items"][0].get("strokeWidth"),
             "xs": [i["x"] for i in m["items"]], "ys": [i["y"] for i in m["items"]]}
            for m in lines if m["items"][0].get("stroke") != GREY]


def references(marks: list[dict]) -> tuple[list[dict], list[str]]:
    """The grey reference lines drawn (their items) and every text drawn that names a reference."""
    grey = [i for m in marks if m["role"] == "mark" for i in m["items"] if i.get("stroke") == GREY]
    texts = [i["text"] for m in marks if m["type"] == "text" and m["role"] == "mark" for i in m["items"]
             if "GPT" in str(i.get("text"))]
    return grey, texts


def test_one_hue_per_run_series_by_dash_and_opacity(two_runs_specs):
    """Two runs of three series each: two colours, not six; within a run the three lines differ by dash/opacity."""
    lines = curve_lines(drawn(two_runs_specs["loss"]))
    assert len(lines) == 6
    by_run: dict[str, set] = {}
    for line in lines:
        by_run.setdefault(line["stroke"], set()).add((line["dash"], line["opacity"], line["width"]))
    assert len(by_run) == 2, f"one colour per run expected, got {sorted(by_run)}"
    assert all(len(styles) == 3 for styles in by_run.values()), by_run
    # the same series looks the same in both runs: only the colour tells the runs apart
    assert len({frozenset(styles) for styles in by_run.values()}) == 1
    assert len({line["stroke"] for line in curve_lines(drawn(two_runs_specs["val_loss_vs_tokens_log"]))}) == 2


def one_run_moved(spec: dict, rev: str, shift: float) -> dict:
    """`spec` with the data of `rev` alone, its losses moved by `shift` nats (its reference figures as they were)."""
    rows = [dict(r, dvc_inferred_y_value=str(float(r["dvc_inferred_y_value"]) + shift))
            if not r["filename"].endswith("baselines.tsv") else r for r in spec["data"]["values"] if r["rev"] == rev]
    return {**spec, "data": {"values": rows}}


LOSS_PLOTS = ("loss", "loss_vs_tokens", "val_loss_vs_tokens_log")


def test_reference_lines_only_where_compare_calls_the_run_comparable(two_runs_specs):
    # neither run scored HellaSwag: no HellaSwag reference is drawn, so the y axis fits the cloze scores
    grey, texts = references(drawn(two_runs_specs["acc_norm"]))
    assert grey == [] and texts == []
    for plot_id in LOSS_PLOTS:
        # `lower` is comparable with GPT-2 124M's val loss, `base` is not; but 3.29 lies 1.9 nats below `lower`, more
        # than half the runs' span (1.5): the axis keeps to the runs, and a note names the figure below it
        spec = two_runs_specs[plot_id]
        grey, texts = references(drawn(spec))
        assert grey == [] and texts == ["OpenAI GPT-2 124M val loss 3.2924: below the axis"], (plot_id, texts)
        # `base` alone: not comparable, nothing drawn
        assert references(drawn(one_run_moved(spec, "base", 0.0))) == ([], []), plot_id
        # `lower` 2.3 nats lower (val loss 3.96 to 3.39 after step 0): 3.29 is within reach, drawn across the whole
        # plot and labelled, inside the axis
        spec = one_run_moved(spec, "lower", -2.3)
        grey, texts = references(drawn(spec))
        assert texts == ["OpenAI GPT-2 124M val loss 3.2924"], (plot_id, texts)
        assert len(grey) == 1 and abs(grey[0]["x2"] - grey[0]["x"]) >= spec["width"] - 1, grey
        assert 0 < grey[0]["y"] < spec["height"], (plot_id, grey)


CHANCE_GREY = "#aaaaaa"  # the accuracy plot's chance line


def test_the_accuracy_plot_draws_the_score_of_a_guess(two_runs_specs):
    """Two lone dots (0.288 and 0.301 on cloze) read as learning only beside what a guess scores: a dashed line at
    0.25 across the plot, labelled, inside the y axis, whatever the scores."""
    spec = two_runs_specs["acc_norm"]
    for moved in (0.0, 0.2):  # the scores near chance, then far above it: the axis stretches to keep the line
        rows = [dict(r, dvc_inferred_y_value=str(float(r["dvc_inferred_y_value"]) + moved))
                if not r["filename"].endswith("baselines.tsv") else r for r in spec["data"]["values"]]
        marks = drawn({**spec, "data": {"values": rows}})
        lines = [i for m in marks if m["role"] == "mark" for i in m["items"] if i.get("stroke") == CHANCE_GREY]
        texts = [i["text"] for m in marks if m["type"] == "text" and m["role"] == "mark" for i in m["items"]
                 if "chance" in str(i.get("text"))]
        assert texts == ["chance 0.25 (a guess among 4 endings)"] and len(lines) == 1, (texts, lines)
        assert abs(lines[0]["x2"] - lines[0]["x"]) >= spec["width"] - 1 and 0 < lines[0]["y"] < spec["height"]
        dots = sorted(i["y"] for m in marks if m["type"] == "symbol" and m["role"] == "mark" for i in m["items"])
        low, high = 0.288 + moved, 0.301 + moved  # y grows downwards: the higher score, the smaller y
        per_pixel = (high - low) / (dots[0] - dots[1])
        assert low + (lines[0]["y"] - dots[1]) * per_pixel == pytest.approx(0.25, abs=1e-4)


def test_runs_drawn_as_one_line_are_named(two_runs_specs, tmp_path):
    """A workspace bit-identical to HEAD draws under it, unseen: a subtitle line names the runs one line shows, in the
    image files (the page: test_the_page_names_runs_drawn_as_one)."""
    spec = two_runs_specs["loss"]
    assert plots.coinciding_runs(spec) == []
    twin = [dict(r, rev="workspace") for r in spec["data"]["values"] if r["rev"] == "lower"]
    both = {**spec, "data": {"values": twin + spec["data"]["values"]}}
    assert plots.coinciding_runs(both) == [["workspace", "lower"]]
    noted = plots.note_coinciding(both)
    assert noted["title"]["subtitle"][-1] == "workspace and lower: the same data, drawn as one line"
    assert noted["title"]["subtitle"][0] == spec["title"]["subtitle"]  # the template's own line stays
    three = {"title": "lr", "data": {"values": [{"rev": r, "step": "1", "lr": "0.1"} for r in ("a", "b", "c")]}}
    assert plots.note_coinciding(three)["title"] == {
        "text": "lr", "subtitle": ["a, b and c: the same data, drawn as one line"]}
    one_row_differs = [dict(r, dvc_inferred_y_value="1.0") if i == 5 else r for i, r in enumerate(twin)]
    assert plots.coinciding_runs({"data": {"values": one_row_differs + spec["data"]["values"]}}) == []
    out = {"errors": [], "data": {"loss": [{"type": "vega", "content": both}]}}
    svg = plots.render_plots(out, tmp_path, fmt="svg", log=lambda m: None)[0].read_text(encoding="utf-8")
    assert "workspace and lower: the same data, drawn as one line" in svg


def test_the_steep_start_runs_off_the_top(two_runs_specs):
    """On the loss plots each curve (both runs' three) starts at the top edge, where it crosses into the axis fitted
    to the runs after their first quarter, and stays inside the plot."""
    for plot_id in ("loss", "loss_vs_tokens"):
        spec = two_runs_specs[plot_id]
        lines = curve_lines(drawn(spec))
        assert len(lines) == 6
        for line in lines:  # in the plot's pixels: (0, 0) is its top left corner
            assert all(-0.5 <= y <= spec["height"] + 0.5 for y in line["ys"]), (plot_id, line["stroke"])
            assert abs(line["ys"][0]) < 0.5, (plot_id, line["stroke"], line["dash"], line["ys"][:3])
            # it crosses in the first quarter: after 0 (10.8 is off the axis), before a quarter of the width
            assert 0 < line["xs"][0] < spec["width"] / 4, (plot_id, line["xs"][:3])


def test_log_x_axis_fitted_to_the_data(two_runs_specs):
    spec = two_runs_specs["val_loss_vs_tokens_log"]
    xs = [x for line in curve_lines(drawn(spec)) for x in line["xs"]]
    # the first evaluation after step 0 at the axis' left end, the last at its right end (not a decade short)
    assert max(xs) - min(xs) >= 0.98 * spec["width"], (min(xs), max(xs))


# ---------------------------------------------------------------------------------------------
# `dvc plots show` offline: the page .dvc/config names

SCRIPT_SRC = re.compile(r"""<script[^>]*\ssrc\s*=\s*["']?\s*(https?:)?//""", re.IGNORECASE)


def check_offline_page(html: str, plot_ids: Iterable[str]) -> None:
    """DVC's page for these plots, with Vega inlined: the bundle is there and no script is fetched over the network."""
    import vl_convert as vlc

    assert html.lstrip().startswith("<!DOCTYPE html>") and "gptcore offline page" in html[:1000]
    assert not SCRIPT_SRC.search(html), SCRIPT_SRC.search(html).group(0)
    assert "cdn.jsdelivr.net" not in html
    assert len(html) > 500_000 and vlc.get_vega_version() in html  # the inlined bundle
    for plot_id in plot_ids:  # DVC's plot divs, each drawn by vegaEmbed
        assert f"vegaEmbed('#{plot_id}', spec)" in html, plot_id


def test_offline_page_is_written_once(tmp_path):
    page = plots.write_offline_page(tmp_path / "plots" / "offline.html")
    html = page.read_text(encoding="utf-8")
    check_offline_page(html, [])
    assert "{plot_divs}" in html and "{refresh_tag}" in html and "{scripts}" not in html  # DVC's placeholders
    before = page.stat().st_mtime_ns
    assert plots.write_offline_page(page) == page and page.stat().st_mtime_ns == before  # up to date: kept
    page.write_text(html.replace("gptcore offline page", "an older page"), encoding="utf-8")
    plots.write_offline_page(page)
    assert page.read_text(encoding="utf-8") == html  # another marker (an older vl-convert or page): rewritten


def test_dvc_config_points_dvc_plots_at_the_committed_offline_page():
    """A fresh clone has the page `dvc plots show` fills (committed), and it is the page this code writes."""
    from configobj import ConfigObj

    template = ConfigObj(str(ROOT / ".dvc" / "config"))["plots"]["html_template"]
    assert (ROOT / ".dvc" / template).resolve() == (ROOT / plots.OFFLINE_PAGE).resolve()
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", str(plots.OFFLINE_PAGE)], cwd=ROOT,
                             capture_output=True, text=True)
    assert tracked.returncode == 0, "plots/offline.html is not committed: a fresh clone's `dvc plots show` fails"
    page = (ROOT / plots.OFFLINE_PAGE).read_text(encoding="utf-8")
    assert page == plots.offline_page(), "the committed page is stale: run `gptcore-render-plots --page` and commit it"


@pytest.mark.slow
def test_dvc_plots_show_works_on_a_fresh_clone_offline(tmp_path):
    """What README tells a newcomer: clone, then `dvc plots show` on the committed run, with no network."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    env = {**os.environ, "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"}
    proc = subprocess.run([str(Path(sys.executable).parent / "dvc"), "plots", "show"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    page = clone / "dvc_plots" / "index.html"
    check_offline_page(page.read_text(encoding="utf-8"), ["loss", "loss_vs_tokens", "val_loss_vs_tokens_log",
                                                          "acc_norm"])
    browser_draws(page, ["loss", "loss_vs_tokens", "val_loss_vs_tokens_log", "acc_norm"])


@pytest.fixture(scope="module")
def diff_page(two_run_repo) -> Path:
    """`gptcore-render-plots --page` run in a subfolder writes the repository's page; \
plain `dvc plots diff` fills it."""
    proc = subprocess.run([sys.executable, "-m", "gptcore.report.plots", "--page"], cwd=two_run_repo / "metrics",
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0 and Path(proc.stdout.strip()) == two_run_repo / plots.OFFLINE_PAGE, proc
    dvc(two_run_repo, "plots", "diff", "base", "lower")
    return two_run_repo / "dvc_plots" / "index.html"


def test_dvc_plots_diff_page_holds_vega_and_fetches_nothing(diff_page):
    check_offline_page(diff_page.read_text(encoding="utf-8"), ["loss", "loss_vs_tokens", "val_loss_vs_tokens_log",
                                                              "acc_norm"])


def test_dvc_plots_diff_page_draws_in_a_headless_browser(diff_page):
    browser_draws(diff_page, ["loss", "loss_vs_tokens", "val_loss_vs_tokens_log", "acc_norm"])


def chromium_dom(page: Path) -> subprocess.CompletedProcess:
    """The page's DOM after headless Chromium has drawn it, with the network cut off (stdout)."""
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no headless Chromium here: the page was checked for its inlined bundle only")
    proc = subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox",
                           "--host-resolver-rules=MAP * ~NOTFOUND",
                           "--virtual-time-budget=20000", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def browser_draws(page: Path, plot_ids: Iterable[str]) -> None:
    """Open the page in headless Chromium with the network cut off: every plot's div holds Vega's drawing (SVG marks
    or a canvas), not only DVC's script."""
    proc = chromium_dom(page)
    divs = {m.group(1): m.end() for m in re.finditer(r'<div id="([^"]+)" class="vega-embed', proc.stdout)}
    ends = sorted(divs.values()) + [len(proc.stdout)]
    for plot_id in plot_ids:
        assert plot_id in divs, f"{plot_id}: vegaEmbed drew nothing there\n{proc.stderr[-2000:]}"
        body = proc.stdout[divs[plot_id]: ends[ends.index(divs[plot_id]) + 1]]
        assert "role-mark" in body or "<canvas" in body, f"{plot_id}: no marks drawn"


# Added to a copy of a page DVC wrote, to read what Vega draws there: after the page's own script has drawn the
# plots (DVC's vegaEmbed calls wait in window.gptcoreQueued for it, which passes them on as it leaves them), each
# queued spec is drawn again, off screen, by the page's vegaEmbed; the views' colour scale (revision -> colour), y
# scale domain and y axis labels go into the page as JSON, per plot div.
_PROBE = """<script type="module">
const plots = {};
for (const [el, spec, opt] of window.gptcoreQueued || []) {
  const box = document.createElement("div");
  document.body.append(box);
  const {view} = await window.vegaEmbed(box, spec, opt);
  await view.runAsync();
  const color = view.scale("color"), y = view.scale("y"), yLabels = [];
  const walk = (node, left) => {
    for (const item of node.items || []) {
      const inLeftAxis = left || (node.role === "axis" && item.orient === "left");
      if (inLeftAxis && node.role === "axis-label") yLabels.push(item.text);
      walk(item, inLeftAxis);
    }
  };
  walk(view.scenegraph().root, false);
  plots[el.replace(/^#/, "")] = {
    colors: color ? Object.fromEntries(color.domain().map((rev) => [rev, color(rev)])) : null,
    y: y ? y.domain() : null,
    yLabels,
    subtitle: (spec.title && spec.title.subtitle) || null,
  };
  box.remove();
}
const out = document.createElement("pre");
out.id = "gptcore-probe";
out.textContent = JSON.stringify(plots);
document.body.append(out);
</script>"""


def browser_probe(page: Path) -> dict[str, dict]:
    """{plot div id: {"colors": {rev: colour}, "y": [y domain], "yLabels": [...], "subtitle": the title's subtitle}}
    of the plots Vega draws on the page (a copy of it, with _PROBE added) in headless Chromium."""
    html = page.read_text(encoding="utf-8")
    calls = len(re.findall(r"vegaEmbed\('#[^']+', spec\)", html))
    assert calls, "no vegaEmbed call of DVC's on the page"
    body, end, tail = html.rpartition("</body>")
    probed = page.with_name("probed.html")
    probed.write_text(body + _PROBE + end + tail, encoding="utf-8")
    dom = chromium_dom(probed).stdout
    found = re.search(r'<pre id="gptcore-probe">(.*?)</pre>', dom, re.S)
    assert found, f"the probe wrote nothing: the page drew no view\n{dom[-2000:]}"
    views = json.loads(html_module.unescape(found.group(1)))
    assert len(views) == calls, f"{calls} plots on the page, {len(views)} drawn: {sorted(views)}"
    return views


@pytest.fixture(scope="module")
def diff_views(diff_page) -> dict[str, dict]:
    """What Vega draws on the page of `dvc plots diff base lower` (browser_probe)."""
    return browser_probe(diff_page)


def test_the_page_gives_each_run_one_colour_in_every_plot(diff_views):
    """Ours and DVC's per-metric plots alike, and `lr`, which only `lower` logged: DVC colours each plot apart, by the
    revisions that have data there, so `lower` took the first colour in it unless the page gives every plot one
    scale."""
    assert {"loss", "acc_norm", "metrics_train_plots_metrics_train_loss_tsv",
            "metrics_train_plots_metrics_lr_tsv"} <= set(diff_views)
    colours: dict[str, set[str]] = {}
    for plot_id, view in diff_views.items():
        assert view["colors"], f"{plot_id}: no colour scale"
        for rev, colour in view["colors"].items():
            colours.setdefault(rev, set()).add(colour)
    assert set(colours) == {"base", "lower"}
    assert all(len(c) == 1 for c in colours.values()), f"a run in more than one colour: {colours}"
    # DVC's first two colours, in its order of the revisions: as its own plots have them where every plot has both
    from dvc_render.vega import OPTIONAL_ANCHOR_RANGES

    assert colours == {"base": {OPTIONAL_ANCHOR_RANGES["color"][0]}, "lower": {OPTIONAL_ANCHOR_RANGES["color"][1]}}


def test_the_files_give_each_run_one_colour_in_every_plot(two_runs_specs):
    """gptcore-render-plots colours as the page does: one scale, the revisions in DVC's order, DVC's colours."""
    from dvc_render.vega import OPTIONAL_ANCHOR_RANGES

    assert list(plots.RUN_COLORS) == OPTIONAL_ANCHOR_RANGES["color"]  # what DVC colours its own plots with
    revs = plots.page_revisions(two_runs_specs.values())
    assert revs == ["base", "lower"]
    assert plots.page_revisions([two_runs_specs["metrics/train/plots/metrics/lr.tsv"]]) == ["lower"]
    scales = []

    def collect(node, key=""):
        if isinstance(node, list):
            for v in node:
                collect(v)
        elif isinstance(node, dict) and key != "data":
            if key == "color" and node.get("field") == "rev":
                scales.append(node["scale"])
            for k, v in node.items():
                collect(v, k)

    for spec in two_runs_specs.values():
        collect(plots.color_runs_alike(spec, revs))
    assert len(scales) >= len(two_runs_specs)
    assert all(s == {"domain": revs, "range": list(plots.RUN_COLORS[:2])} for s in scales), scales
    # and the templates alone colour as DVC does where every plot has every run: its colours, in its order
    for name in ("gptcore_lines", "gptcore_lines_logx", "gptcore_acc_norm"):
        template = (ROOT / ".dvc" / "plots" / f"{name}.json").read_text(encoding="utf-8")
        assert template.count('"field": "rev", "type": "nominal"') == template.count('"sort": null') >= 1, name
        assert template.count(json.dumps(list(plots.RUN_COLORS))) == template.count('"sort": null'), name


def committed(repo: Path, rev: str, name: str) -> list[list[float]]:
    """The rows of a plot data file (metrics/plots/<name>.tsv) as committed in `rev`, as numbers."""
    path = (PLOT_DATA / f"{name}.tsv").as_posix()
    text = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout
    return [[float(v) for v in line.split("\t")] for line in text.splitlines()[1:]]


def late(repo: Path, rev: str) -> list[float]:
    """A run's losses after its first quarter (train, raw and averaged, and val), from its committed plot data."""
    out = []
    for name, columns in (("train_loss", (2, 3)), ("val_loss", (2,))):
        rows = committed(repo, rev, name)
        end = max(r[0] for r in rows)
        out += [r[c] for r in rows if r[0] >= end / 4 for c in columns]
    return out


def test_the_loss_axes_are_fitted_to_the_runs(diff_views, two_run_repo):
    """The loss plots' y axis spreads the runs over most of its height: the losses after each run's first quarter
    fill 80% of it (the step-0 loss of 10.8 and GPT-2's 3.29 squeezed them into a seventh), and the axis starts
    nowhere near 0."""
    data = late(two_run_repo, "base") + late(two_run_repo, "lower")
    lo, hi = min(data), max(data)
    for plot_id in ("loss", "loss_vs_tokens"):
        y0, y1 = diff_views[plot_id]["y"]
        assert y0 <= lo and hi <= y1, (plot_id, (y0, y1), (lo, hi))
        assert (hi - lo) >= 0.8 * (y1 - y0), (plot_id, (y0, y1), (lo, hi))
    y0, y1 = diff_views["val_loss_vs_tokens_log"]["y"]  # every evaluation but step 0's
    vals = [r[2] for rev in ("base", "lower") for r in committed(two_run_repo, rev, "val_loss") if r[0] > 0]
    assert y0 <= min(vals) and max(vals) <= y1 and (max(vals) - min(vals)) >= 0.6 * (y1 - y0), ((y0, y1), vals)


def acc_axis_reads_as_accuracy(view: dict, values: list[float]) -> None:
    """The acc_norm plot's y axis: decimals (0.286, not "0"), distinct, and each score inside it, off its edges."""
    labels = view["yLabels"]
    assert len(labels) >= 3 and all(re.fullmatch(r"0\.\d{2,3}", t) for t in labels), labels
    assert len(set(labels)) == len(labels), labels
    y0, y1 = view["y"]
    assert all(y0 < v < y1 for v in values), ((y0, y1), values)


def test_the_accuracy_axis_reads_as_accuracy(diff_views):
    acc_axis_reads_as_accuracy(diff_views["acc_norm"], [0.288, 0.301])


@pytest.fixture(scope="module")
def workspace_page(two_run_repo, diff_page) -> Path:
    """README's plot command on a fresh clone: `dvc plots diff`, the workspace the same as HEAD (`lower`); the offline
    page is diff_page's."""
    out = json.loads(dvc(two_run_repo, "plots", "diff", "--json"))
    assert {r["revisions"][0] for rs in out["data"].values() for r in rs} == {"workspace"}
    dvc(two_run_repo, "plots", "diff", "-o", "dvc_plots_workspace")
    return two_run_repo / "dvc_plots_workspace" / "index.html"


def test_one_run_alone_gets_fitted_axes_too(workspace_page):
    """The committed run alone, as a fresh clone's `dvc plots diff` (and `dvc plots show`) draws it: the cloze score is
    one point, which drew an axis of one tick labelled "0"."""
    views = browser_probe(workspace_page)
    assert {rev for view in views.values() for rev in view["colors"]} == {"workspace"}
    acc_axis_reads_as_accuracy(views["acc_norm"], [0.301])
    y0, y1 = views["loss"]["y"]
    assert 4.5 < y0 < 5.4 and 6.0 < y1 < 6.6, (y0, y1)  # `lower`'s last three quarters: 5.2 to 6.4


def test_readme_plot_command_sets_the_workspace_beside_the_committed_run(two_run_repo, tmp_path):
    """`dvc plots diff` with no revision: the workspace alone while it is the committed run (above), the workspace
    and HEAD once it holds another run's results (here `base`'s, checked out over `lower`'s)."""
    repo = tmp_path / "repo"
    shutil.copytree(two_run_repo, repo, ignore=shutil.ignore_patterns("dvc_plots*"))
    subprocess.run(["git", "checkout", "base", "--", "metrics"], cwd=repo, check=True, capture_output=True)
    out = json.loads(dvc(repo, "plots", "diff", "--json"))
    assert not out.get("errors"), out["errors"]
    assert out["data"]["loss"][0]["revisions"] == ["workspace", "HEAD"]


@pytest.mark.slow
def test_readme_s_top_image_is_drawn_from_the_committed_run_with_only_the_references_that_apply(tmp_path):
    """`python -m tools.readme_image` in a fresh clone draws README's top image from the committed quick start: its
    loss curves by tokens seen, and no GPT-2 line, which compare found not comparable with a Shakespeare run."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    judged = json.loads((clone / "metrics" / "comparison.json").read_text(encoding="utf-8"))["comparable"]
    assert not any(c["comparable"] for c in judged.values())  # the committed run: Shakespeare, cloze
    env = dict(os.environ, PYTHONPATH=str(clone), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    out = {}
    for fmt in ("png", "svg"):
        proc = subprocess.run([sys.executable, "-m", "tools.readme_image", "--out-dir", str(tmp_path), "--format", fmt],
                              cwd=clone, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and proc.stdout.strip() == str(tmp_path / f"loss_vs_tokens.{fmt}"), proc
        out[fmt] = (tmp_path / f"loss_vs_tokens.{fmt}").read_bytes()
    assert out["png"].startswith(PNG_MAGIC)
    svg = out["svg"].decode("utf-8")
    assert "Loss by tokens seen" in svg and ">quickstart<" in svg and "val loss" in svg
    assert "GPT" not in svg and f'stroke="{GREY}"' not in svg, "a reference line that does not apply here"
    # README's first image is the one the command writes, committed
    first = re.search(r"!\[[^]]*\]\(([^)]+)\)", (ROOT / "README.md").read_text(encoding="utf-8")).group(1)
    assert first == "docs/loss_vs_tokens.png" and (clone / first).is_file()
    proc = subprocess.run([sys.executable, "-m", "tools.readme_image", "quickstart=HEAD", "again=HEAD"], cwd=clone,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "each revision and each name once" in proc.stderr, proc


def test_the_page_names_runs_drawn_as_one(two_run_repo, diff_page, tmp_path):
    """`dvc plots diff` after a rerun that reproduced the committed run bit for bit (here: a tracked file changed, the
    results not): the workspace and HEAD, the same curves, one hidden under the other; each plot says so."""
    repo = tmp_path / "repo"
    shutil.copytree(two_run_repo, repo, ignore=shutil.ignore_patterns("dvc_plots*"))
    with open(repo / ".gitignore", "a", encoding="utf-8") as f:
        f.write("# a tracked file changed\n")
    dvc(repo, "plots", "diff")
    views = browser_probe(repo / "dvc_plots" / "index.html")
    note = "workspace and HEAD: the same data, drawn as one line"
    assert {rev for view in views.values() for rev in view["colors"]} == {"workspace", "HEAD"}
    for plot_id, view in views.items():
        assert view["subtitle"] and view["subtitle"][-1] == note, (plot_id, view["subtitle"])


# ---------------------------------------------------------------------------------------------
# the speedrun metric (compare stage)

def speedrun_run(live: Path) -> None:
    """10 steps of 256 tokens at 100 ms each, evals at 0, 5, 10 with val loss 10, 8, 6."""
    fake_run(live)
    write_live(live, "step_ms", [(s, 100.0) for s in range(10)])


def test_tokens_to_target_is_the_first_eval_at_or_below_it(tmp_path):
    from gptcore.report.speedrun import describe_speedrun, speedrun_summary

    live = tmp_path / "live"
    speedrun_run(live)
    s = speedrun_summary(live, 8.0)
    assert (s["reached"], s["steps_to_target"], s["tokens_to_target"]) == (True, 5, 5 * 256)
    assert s["train_hours"] == pytest.approx(1.0 / 3600) and s["hours_to_target"] == pytest.approx(0.5 / 3600)
    assert s["gpu_hours"] is None and "1,280 tokens" in describe_speedrun(s)
    gpu = speedrun_summary(live, 7.0, {"device": "cuda", "processes": 8})
    assert gpu["tokens_to_target"] == 10 * 256 and gpu["gpu_hours"] == pytest.approx(8.0 / 3600)
    assert gpu["gpu_hours_to_target"] == pytest.approx(8.0 / 3600)
    never = speedrun_summary(live, 5.0)
    assert not never["reached"] and never["tokens_to_target"] is None and never["hours_to_target"] is None
    assert "never reached" in describe_speedrun(never)
    none = speedrun_summary(live, None)
    assert none["tokens_to_target"] is None and "null" in describe_speedrun(none)


def test_compare_target_param_is_checked():
    from gptcore.report.config import CompareConfig

    assert CompareConfig.read({"target_val_loss": 3}).target_val_loss == 3.0
    assert CompareConfig.read({"target_val_loss": None}).target_val_loss is None
    for bad in (0, "low", True):
        with pytest.raises(UserError, match=f"compare.target_val_loss={bad!r}: must be a number > 0 or null"):
            CompareConfig.read({"target_val_loss": bad})
    with pytest.raises(UserError, match="compare.target=1: unknown param"):
        CompareConfig.read({"target_val_loss": 3.0, "target": 1})
