"""gptcore.report.plots and baselines: the plot data the compare stage writes, dvc.yaml's plot definitions, offline rendering."""
import io
import json
from pathlib import Path

import pytest
import yaml

from gptcore.errors import UserError
from gptcore.report import plots
from gptcore.report.baselines import baseline_values, read_baselines
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


def test_plot_data_tokens_and_baseline_span(tmp_path):
    live, out = tmp_path / "metrics" / "train", tmp_path / "metrics" / "plots"
    fake_run(live)
    written = plots.write_plot_data(live, BASELINES, out)
    assert sorted(p.name for p in written) == ["baselines.tsv", "train_loss.tsv", "val_loss.tsv"]

    train = read_tsv(out / "train_loss.tsv")
    assert train[0] == ["step", "tokens_seen", "train_loss", "train_loss_smooth"]
    # a training step s has consumed s + 1 batches ...
    assert [(int(s), int(t)) for s, t, _, _ in train[1:]] == [(s, (s + 1) * 256) for s in range(10)]
    # the raw loss is kept; the smoothed one starts at the first value and lags behind a falling curve
    assert [float(r[2]) for r in train[1:]] == [10.0 - s * 0.5 for s in range(10)]
    smooth = [float(r[3]) for r in train[1:]]
    assert smooth[0] == pytest.approx(10.0) and all(m > float(r[2]) for m, r in zip(smooth[1:], train[2:]))
    # ... an evaluation at step s runs before that step's update
    val = read_tsv(out / "val_loss.tsv")
    assert [(int(s), int(t)) for s, t, _ in val[1:]] == [(0, 0), (5, 1280), (10, 2560)]
    assert float(val[-1][2]) == pytest.approx(6.0)

    base = read_tsv(out / "baselines.tsv")
    assert base[0] == ["step", "tokens_seen", "gpt2_124m_val_loss", "gpt2_124m_hellaswag_acc_norm",
                       "gpt3_124m_hellaswag_acc_norm"]
    # two rows spanning the run: a horizontal line from the first to the last logged step and token count
    assert [(int(r[0]), int(r[1])) for r in base[1:]] == [(0, 0), (10, 2560)]
    assert [float(x) for x in base[1][2:]] == [3.2924, 0.2955, 0.337]
    assert base[1][2:] == base[2][2:]


def test_plot_data_hellaswag_curve_and_stale_files(tmp_path):
    live, out = tmp_path / "train", tmp_path / "plots"
    fake_run(live)
    write_live(live, "hellaswag_acc_norm", [(0, 0.25), (5, 0.26), (10, 0.27)])
    names = {p.name for p in plots.write_plot_data(live, BASELINES, out, {"hellaswag": 0.28})}
    assert {"hellaswag_acc_norm.tsv", "acc_norm.tsv"} <= names
    assert read_tsv(out / "hellaswag_acc_norm.tsv")[-1] == ["10", "2560", "0.27"]
    # the acc_norm plot's data: the training curve, then the evaluate stage's final score at the last step
    assert read_tsv(out / "acc_norm.tsv") == [["step", "tokens_seen", "task", "acc_norm"],
                                              ["0", "0", "hellaswag", "0.25"], ["5", "1280", "hellaswag", "0.26"],
                                              ["10", "2560", "hellaswag", "0.27"], ["10", "2560", "hellaswag", "0.28"]]

    # the next run logs no HellaSwag: its curve must not survive from the run before; a cloze run gets its point
    (live / "plots" / "metrics" / "hellaswag_acc_norm.tsv").unlink()
    plots.write_plot_data(live, BASELINES, out, {"cloze": 0.4})
    assert not (out / "hellaswag_acc_norm.tsv").exists()
    assert read_tsv(out / "acc_norm.tsv")[1:] == [["10", "2560", "cloze", "0.4"]]
    plots.write_plot_data(live, BASELINES, out)
    assert not (out / "acc_norm.tsv").exists()
    assert not list(out.glob(".*.tmp")), "temp files left behind"


def test_plot_data_without_training_steps(tmp_path):
    """train.max_steps 0 (the OpenAI baseline preset): one val point at step 0, no tokens_seen.tsv."""
    live, out = tmp_path / "train", tmp_path / "plots"
    write_live(live, "val_loss", [(0, 3.29)])
    plots.write_plot_data(live, BASELINES, out)
    assert read_tsv(out / "val_loss.tsv")[1:] == [["0", "0", "3.29"]]
    assert [r[:2] for r in read_tsv(out / "baselines.tsv")[1:]] == [["0", "0"], ["0", "0"]]


def test_plot_data_reads_the_repository_baselines(tmp_path):
    fake_run(tmp_path / "train")
    plots.write_plot_data(tmp_path / "train", read_baselines(ROOT / "conf" / "baselines.yaml"), tmp_path / "plots")
    figures = yaml.safe_load((ROOT / "conf" / "baselines.yaml").read_text(encoding="utf-8"))
    row = read_tsv(tmp_path / "plots" / "baselines.tsv")[1]
    assert float(row[2]) == figures["gpt2_124m"]["val_loss"]
    assert float(row[4]) == figures["gpt3_124m"]["hellaswag_acc_norm"]


def test_plot_data_bad_input(tmp_path):
    with pytest.raises(UserError, match="run the train stage first"):
        plots.write_plot_data(tmp_path / "nothing", BASELINES, tmp_path / "plots")
    live = tmp_path / "train"
    fake_run(live)
    (live / "plots" / "metrics" / "val_loss.tsv").write_text("step\tval_loss\n0\tnan-ish\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"val_loss\.tsv: line 2"):
        plots.write_plot_data(live, BASELINES, tmp_path / "plots")
    fake_run(live)
    with pytest.raises(UserError, match="gpt2_124m needs numeric hellaswag_acc_norm"):
        plots.write_plot_data(live, {"gpt2_124m": {"val_loss": 3.3}}, tmp_path / "plots")
    with pytest.raises(UserError, match="gpt3_124m.hellaswag_acc_norm must be a number, got 'n/a'"):
        plots.write_plot_data(live, {**BASELINES, "gpt3_124m": {"hellaswag_acc_norm": "n/a"}}, tmp_path / "plots")


def test_dvc_yaml_plots_read_what_is_written():
    """Every series of dvc.yaml's top-level plots names a column its file really has (dvclive's or ours)."""
    dvc_yaml = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    defs = {k: v for d in dvc_yaml["plots"] for k, v in d.items()}
    assert {"loss", "loss_vs_tokens", "val_loss_vs_tokens_log", "acc_norm"} <= set(defs)
    ours = {"baselines.tsv": {"step", "tokens_seen", *baseline_values(BASELINES)}}
    ours.update({f"{c}.tsv": {"step", "tokens_seen", c} for c in plots.CURVES})
    ours["train_loss.tsv"].add("train_loss_smooth")
    ours["acc_norm.tsv"] = {"step", "tokens_seen", "task", "acc_norm"}
    live = LIVE_DIR / "plots" / "metrics"
    for name, d in defs.items():
        for path, fields in d["y"].items():
            path = Path(path)
            fields = [fields] if isinstance(fields, str) else fields
            if path.parent == live:  # dvclive: step and the metric named like the file
                columns = {"step", path.stem}
            else:
                assert path.parent == PLOT_DATA, f"plot {name}: {path} is neither dvclive's nor ours"
                columns = ours[path.name]
            assert d["x"] in columns and set(fields) <= columns, f"plot {name}: {path} has columns {columns}"
    # the reference lines are in each plot; the templates are the project's (.dvc/plots/)
    for name in ("loss", "loss_vs_tokens", "val_loss_vs_tokens_log"):
        assert "gpt2_124m_val_loss" in defs[name]["y"]["metrics/plots/baselines.tsv"]
    assert defs["loss_vs_tokens"]["x"] == defs["val_loss_vs_tokens_log"]["x"] == "tokens_seen"
    assert set(defs["acc_norm"]["y"]["metrics/plots/baselines.tsv"]) == {
        "gpt2_124m_hellaswag_acc_norm", "gpt3_124m_hellaswag_acc_norm"}
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
    with pytest.raises(SystemExit, match="gptcore-render-plots: no plots"):
        plots.main(["--out", str(tmp_path / "png")])
    (tmp_path / "x.json").write_text("Running stage...", encoding="utf-8")
    with pytest.raises(SystemExit, match="x.json: not JSON; expected the output of `dvc plots show --json`"):
        plots.main([str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="nope.json: cannot read"):
        plots.main([str(tmp_path / "nope.json")])
    assert not (tmp_path / "png").exists()


def test_baselines_file_is_checked_and_named(tmp_path):
    figures = read_baselines(ROOT / "conf" / "baselines.yaml")
    assert baseline_values(figures) == {"gpt2_124m_val_loss": 3.2924, "gpt2_124m_hellaswag_acc_norm": 0.2955,
                                        "gpt3_124m_hellaswag_acc_norm": 0.337}
    (tmp_path / "b.yaml").write_text("gpt2_124m: {val_loss: 3.0}\n", encoding="utf-8")
    with pytest.raises(UserError, match="b.yaml: gpt2_124m needs numeric hellaswag_acc_norm"):
        read_baselines(tmp_path / "b.yaml")


def test_smooth_is_a_debiased_moving_average():
    assert plots.smooth([4.0, 4.0, 4.0]) == pytest.approx([4.0, 4.0, 4.0])  # no pull towards zero at the start
    m = plots.smooth([1.0, 3.0], beta=0.5)
    assert m == pytest.approx([1.0, (0.25 * 1 + 0.5 * 3) / 0.75])


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
    from gptcore.report.params import COMPARE

    assert COMPARE.validate({"target_val_loss": 3}) == {"target_val_loss": 3.0}
    assert COMPARE.validate({"target_val_loss": None}) == {"target_val_loss": None}
    for bad in (0, "low", True):
        with pytest.raises(UserError, match=f"compare.target_val_loss={bad!r}: must be a number > 0 or null"):
            COMPARE.validate({"target_val_loss": bad})
    with pytest.raises(UserError, match="compare.target=1: unknown param"):
        COMPARE.validate({"target_val_loss": 3.0, "target": 1})
