"""Faults and test-only numerics injected into every process of a stage run (the stage, torchrun's agent, each rank),
by tests that put this folder on PYTHONPATH (tests/stagekit.py: env(inject=...)); each only where its variable is set:

GPTCORE_TEST_NS_FP32=1: Muon's Newton-Schulz iteration in fp32 instead of bf16 (as tests/test_loss_curve.py runs
    it), so that two runs whose sums round differently stay comparable to fp32 precision;
GPTCORE_TEST_KILL_SAVE=<step>:<point>:<rank>: SIGKILL that rank during the checkpoint save of that step, at <point>:
    `shard` right after the rank wrote its shard file, `rename` right before rank 0 renames the whole folder in;
GPTCORE_TEST_SLOW_SAVE=<seconds>: every checkpoint save waits that long (in Python, where a signal's handler runs)
    right before its folder is renamed in, every file written: a save a second signal can land in.
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

if os.environ.get("GPTCORE_TEST_SLOW_SAVE"):
    import time

    from gptcore.train import checkpoints

    _wait, _swap_now = float(os.environ["GPTCORE_TEST_SLOW_SAVE"]), checkpoints.swap_dir

    def _slow_swap(staged, final):
        time.sleep(_wait)
        return _swap_now(staged, final)

    checkpoints.swap_dir = _slow_swap
