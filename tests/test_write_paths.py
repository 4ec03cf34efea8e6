"""One rule for every path the pipeline writes (gptcore/atomic.py, check_writable and staged_dir): never through a
symbolic link inside the project, never a rename a mount point or another file system cannot take. Each case runs a
stage in this process, as `python -m stages.<name>` does: one line naming the path and what to do, exit 1, and
nothing written outside the project nor lost inside it."""
from __future__ import annotations

import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from test_bad_params import changed, make_full_project, message_lines, run_here, snapshot

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    p = make_full_project(tmp_path_factory.mktemp("paths") / "project")
    (p / "conf").mkdir()
    shutil.copy(ROOT / "conf" / "baselines.yaml", p / "conf" / "baselines.yaml")
    params = yaml.safe_load((p / "params.yaml").read_text())
    params["compare"] = {"target_val_loss": None}
    (p / "params.yaml").write_text(yaml.safe_dump(params))
    return p


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside the project with a file of someone's in it."""
    folder = tmp_path / "someone_elses"
    folder.mkdir()
    (folder / "loss.tsv").write_text("theirs\n")
    return folder


@contextmanager
def linked(path: Path, target: Path) -> Iterator[None]:
    """`path` replaced by a symbolic link to `target` for the block, then put back."""
    saved = path.with_name(path.name + ".saved")
    if path.exists():
        path.rename(saved)
    path.symlink_to(target, target_is_directory=True)
    try:
        yield
    finally:
        path.unlink()
        if saved.exists():
            saved.rename(path)


@contextmanager
def mounted(path: Path) -> Iterator[None]:
    """A tmpfs mounted at `path` for the block (its files copied in), where this process may mount (root)."""
    saved = path.with_name(path.name + ".saved")
    if path.exists():
        shutil.copytree(path, saved)
    path.mkdir(exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(path)], capture_output=True).returncode:
        shutil.rmtree(saved, ignore_errors=True)
        pytest.skip("cannot mount here (not root): the mount-point cases need one")
    try:
        if saved.exists():
            shutil.copytree(saved, path, dirs_exist_ok=True)
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)
        if saved.exists():
            shutil.rmtree(path)
            saved.rename(path)


@contextmanager
def bind_mounted(path: Path) -> Iterator[None]:
    """A folder beside the project bind-mounted at `path` for the block (`path`'s files copied into it): the same
    file system, so os.path.ismount does not see it. Skips where this process may not mount (not root)."""
    source = path.parent.parent / f"{path.name}.bind_source"
    shutil.rmtree(source, ignore_errors=True)
    if path.exists():
        shutil.copytree(path, source)
    else:
        source.mkdir()
    path.mkdir(exist_ok=True)
    if subprocess.run(["mount", "--bind", str(source), str(path)], capture_output=True).returncode:
        shutil.rmtree(source)
        pytest.skip("cannot bind-mount here (not root, or no mount namespace of its own): the case needs one")
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)
        shutil.rmtree(source)


def refused(project: Path, stage: str, says: str) -> None:
    """The stage exits 1 with one line containing `says`."""
    ran = run_here(project, [f"stages.{stage}"])
    lines = message_lines(ran.stderr)
    assert ran.status == 1 and len(lines) == 1 and says in lines[0], ran.stderr[-2000:]


def with_params(project: Path, **changes) -> dict:
    """params.yaml with `changes` (section__key=value); returns the old text's parsed params to restore."""
    old = yaml.safe_load((project / "params.yaml").read_text())
    new = yaml.safe_load((project / "params.yaml").read_text())
    for name, value in changes.items():
        section, key = name.split("__")
        new[section][key] = value
    (project / "params.yaml").write_text(yaml.safe_dump(new))
    return old


def test_compare_writes_no_plot_data_through_a_linked_metrics_plots(project, outside):
    ran = run_here(project, ["stages.compare"])  # the folder exists as compare makes it
    assert ran.status == 0, ran.stderr[-2000:]
    before = snapshot(project)
    with linked(project / "metrics" / "plots", outside):
        refused(project, "compare", "metrics/plots is a symbolic link")
    assert sorted(p.name for p in outside.iterdir()) == ["loss.tsv"]
    assert (outside / "loss.tsv").read_text() == "theirs\n"
    assert changed(before, snapshot(project)) == []


def test_a_fresh_run_moves_nothing_through_a_linked_checkpoints_previous(project, outside):
    before = snapshot(project)
    old = with_params(project, train__max_lr=2e-3)  # other params: a fresh start moves the finished run aside
    try:
        with linked(project / "checkpoints" / "previous", outside):
            refused(project, "train", "checkpoints/previous is a symbolic link")
    finally:
        (project / "params.yaml").write_text(yaml.safe_dump(old))
    assert sorted(p.name for p in outside.iterdir()) == ["loss.tsv"]
    assert changed(before, snapshot(project)) == []


def test_a_fresh_run_moves_nothing_to_a_checkpoints_previous_on_another_disk(project):
    before = snapshot(project)
    old = with_params(project, train__max_lr=2e-3)
    try:
        with mounted(project / "checkpoints" / "previous"):
            refused(project, "train", "checkpoints/previous is on another file system than checkpoints")
            assert not any((project / "checkpoints" / "previous").iterdir())  # no empty folder left there
    finally:
        (project / "params.yaml").write_text(yaml.safe_dump(old))
        (project / "checkpoints" / "previous").rmdir()
    assert changed(before, snapshot(project)) == []


def test_model_as_a_mount_point_is_refused_before_training(project):
    before = snapshot(project)
    old = with_params(project, train__max_lr=3e-3)
    try:
        with mounted(project / "model"):
            refused(project, "train", "model is a mount point")
            assert not (project / ".model.next").exists()
    finally:
        (project / "params.yaml").write_text(yaml.safe_dump(old))
    assert changed(before, snapshot(project)) == []


def test_a_writer_takes_no_lock_under_a_linked_folder(tmp_path, outside):
    """The lock file too is written only where the rule allows: a folder whose parent is a link is refused."""
    from gptcore.folders import LinkedFolder
    from gptcore.locks import FolderLock

    project = tmp_path / "p"
    project.mkdir()
    (project / "metrics").symlink_to(outside, target_is_directory=True)
    cwd = Path.cwd()
    try:
        import os

        os.chdir(project)
        with pytest.raises(LinkedFolder, match="metrics is a symbolic link"):
            FolderLock(Path("metrics") / "train", "train").acquire()
    finally:
        os.chdir(cwd)
    assert sorted(p.name for p in outside.iterdir()) == ["loss.tsv"]


def test_a_bind_mounted_model_is_refused_when_a_finished_run_reruns(project):
    """model/ bind-mounted from the same disk (os.path.ismount says no): the finished run rerun once built 27 MB of
    .model.next and ended in EBUSY's traceback; the mount table names the mount point before anything is built."""
    import os

    from gptcore.folders import is_mount_point

    before = snapshot(project)
    with bind_mounted(project / "model"):
        assert not os.path.ismount(project / "model") and is_mount_point(project / "model")
        refused(project, "train", "model is a mount point: a run replaces model/ whole by a rename")
        assert not (project / ".model.next").exists()
    assert changed(before, snapshot(project)) == []


def test_a_bind_mounted_checkpoints_previous_is_refused_before_anything_moves(project):
    before = snapshot(project)
    old = with_params(project, train__max_lr=2e-3)  # other params: a fresh run would move the finished one there
    try:
        with bind_mounted(project / "checkpoints" / "previous"):
            refused(project, "train", "checkpoints/previous is on another file system than checkpoints, or a mount "
                                      "point")
            assert not any((project / "checkpoints" / "previous").iterdir())
    finally:
        (project / "params.yaml").write_text(yaml.safe_dump(old))
        (project / "checkpoints" / "previous").rmdir()
    assert changed(before, snapshot(project)) == []


def test_the_mount_table_s_escapes_are_read_back(tmp_path):
    """A mount point whose name holds a space: /proc/self/mountinfo writes it as \\040."""
    from gptcore.folders import is_mount_point

    spaced = tmp_path / "a folder"
    spaced.mkdir()
    with bind_mounted(spaced):
        assert is_mount_point(spaced) and not is_mount_point(tmp_path)
