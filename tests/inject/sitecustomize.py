"""Faults and test-only numerics injected into every process of a stage run (the stage, torchrun's agent, each rank),
by tests that put this folder on PYTHONPATH (tests/stagekit.py: env(inject=...)); each only where its variable is set:

GPTCORE_TEST_NS_FP32=1: Muon's Newton-Schulz iteration in fp32 instead of bf16 (as tests/test_loss_curve.py runs
    it), so that two runs whose sums round differently stay comparable to fp32 precision;
GPTCORE_TEST_KILL_SAVE=<step>:<point>:<rank>: SIGKILL that rank during the checkpoint save of that step, at <point>:
    `shard` right after the rank wrote its shard file, `rename` right before rank 0 renames the whole folder in;
GPTCORE_TEST_SLOW_SAVE=<seconds>: every checkpoint save waits that long (in Python, where a signal's handler runs)
    right before its folder is renamed in, every file written: a save a second signal can land in.
GPTCORE_TEST_WRITE_WHILE_READ=<read>:<write>: once fetch has read the text file <read>, a line is appended to <write>
    (the same file: it changed while fetch read it; another: a file came meanwhile).
GPTCORE_TEST_EXIT=<rank>:<where>:<status>: that rank calls sys.exit(<status>) at <where>: `start`, as it is about to
    join the other ranks, or a step number, as that training step begins (a rank that ends early);
GPTCORE_TEST_SIGTERM_HANDLED=1: every rank takes SIGTERM in a Python handler that returns, as a rank that finishes its
    step before it stops would: one blocked in C (a collective) then does not end on it.
"""
import os

if os.environ.get("GPTCORE_TEST_NS_FP32") == "1":
    from unittest import mock

    import torch
    from torch.optim._muon import _zeropower_via_newtonschulz

    from gptcore.train.optimizers import muon

    def _newton_schulz_fp32(grad, *args):
        with mock.patch.object(torch.Tensor, "bfloat16", lambda t: t.to(torch.float32, copy=True)):
            return _zeropower_via_newtonschulz(grad, *args)

    muon._zeropower_via_newtonschulz = _newton_schulz_fp32

if os.environ.get("GPTCORE_TEST_KILL_SAVE"):
    import signal

    from torch.distributed.checkpoint import FileSystemWriter

    from gptcore.train import checkpoints

    _step, _point, _rank = os.environ["GPTCORE_TEST_KILL_SAVE"].split(":")
    _folder = checkpoints.checkpoint_path(".", int(_step)).name

    def _die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def _mine() -> bool:
        return os.environ.get("RANK", "0") == _rank

    if _point == "shard":
        _write = FileSystemWriter.write_data

        def _write_then_die(self, plan, planner):
            done = _write(self, plan, planner)
            done.wait()
            if _mine() and _folder in str(self.path):
                _die()
            return done

        FileSystemWriter.write_data = _write_then_die
    elif _point == "rename":
        _swap = checkpoints.swap_dir

        def _die_before_swap(staged, final):
            if _mine() and str(final).endswith(_folder):
                _die()
            return _swap(staged, final)

        checkpoints.swap_dir = _die_before_swap

if os.environ.get("GPTCORE_TEST_WRITE_WHILE_READ"):
    from pathlib import Path

    from gptcore.data.sources import local

    _read_path, _write_path = os.environ["GPTCORE_TEST_WRITE_WHILE_READ"].split(":")
    _read_utf8 = local.read_utf8

    def _read_then_write(path):
        text = _read_utf8(path)
        if Path(path) == Path(_read_path):
            with open(_write_path, "a", encoding="utf-8") as f:
                f.write("a line written while fetch read the file\n")
        return text

    local.read_utf8 = _read_then_write
if os.environ.get("GPTCORE_TEST_EXIT") and "RANK" in os.environ:
    import sys

    from gptcore import distributed

    _rank, _where, _status = os.environ["GPTCORE_TEST_EXIT"].split(":")
    if os.environ["RANK"] == _rank:
        if _where == "start":
            def _exit_at_setup(*args, **kwargs):
                sys.exit(int(_status))

            distributed.setup = _exit_at_setup
        else:
            _progress = distributed.progress

            def _exit_at_step(step, doing):
                _progress(step, doing)
                if doing == "training" and step == int(_where):
                    sys.exit(int(_status))

            distributed.progress = _exit_at_step

if os.environ.get("GPTCORE_TEST_SIGTERM_HANDLED") == "1" and "RANK" in os.environ:
    import signal

    from gptcore import lifetime

    _mortal = lifetime.mortal

    def _mortal_taking_sigterm() -> None:
        _mortal()
        signal.signal(signal.SIGTERM, lambda signum, frame: None)

    lifetime.mortal = _mortal_taking_sigterm

if os.environ.get("GPTCORE_TEST_SLOW_SAVE"):
    import time

    from gptcore.train import checkpoints

    _wait, _swap_now = float(os.environ["GPTCORE_TEST_SLOW_SAVE"]), checkpoints.swap_dir

    def _slow_swap(staged, final):
        time.sleep(_wait)
        return _swap_now(staged, final)

    checkpoints.swap_dir = _slow_swap
