"""slurm/train.sbatch on a real SLURM started here: Debian's slurmctld and slurmd, authenticated by munge, two nodes on
this machine (a slurmd for each node name, both names this machine's). The train stage submitted on one node of 2
ranks and on two nodes of 1, each sent the time-limit warning (SIGUSR1 to the batch script, as --signal=B:USR1 sends
it) once a checkpoint is written: the script passes it to the ranks, requeues the job, and the next run resumes from
the newest checkpoint and ends on the weights of the uninterrupted run (the stage on one node of 2 ranks), bit for
bit. A run that fails on its own is not requeued.

The cluster (`slurm_conf` writes it): one slurmctld, no accounting, no cgroups (proctrack/linuxproc, task/none),
select/cons_tres over 2 CPUs a node, every daemon, state and socket in a temp folder, on free ports; it is stopped,
and every job cancelled, at the end. SLURM holds a requeued job until the first run's job credential has expired
(AuthInfo cred_expire + 1 s; a slurmd refuses to start a job again before): the default, 120 s, is 10 s here, and
the scheduler looks at pending jobs every second (sched_interval, 60 s by default).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch
from stagekit import ROOT, env, make_project, run_stage, write_gpt2_shards

from gptcore.train import checkpoints

SCRIPT = ROOT / "slurm" / "train.sbatch"
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo")
# 256 tokens a step: 2 ranks of micro batch 4 x 32; long enough for the warning to land before the end
RUN = dict(micro_batch=4, total_batch_tokens=256, max_steps=40, ckpt_every=4, keep_checkpoints=20, eval_every=10)


def node_names() -> list[str]:
    """Two names of this machine for two slurmd: its host name (slurmctld runs as it) and localhost."""
    names = [socket.gethostname().split(".")[0], "localhost"]
    try:
        local = all(socket.gethostbyname(n).startswith("127.") for n in names)
    except OSError:
        local = False
    return names if local and names[0] != names[1] else []


def why_not() -> str | None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"needs SLURM and munge (Debian: slurmctld slurmd slurm-client munge; .ci/run installs them): " \
               f"{', '.join(missing)} not found"
    if os.geteuid() != 0:
        return "slurmd starts jobs only as root"
    if not node_names():
        return "needs this machine's host name and localhost both resolving to a loopback address (two nodes)"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(why_not() is not None, reason=why_not() or "")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_conf(folder: Path, nodes: list[str]) -> str:
    """The whole slurm.conf of the test's cluster: one controller, `nodes` on this machine (2 CPUs each)."""
    node_lines = "\n".join(f"NodeName={n} NodeAddr=127.0.0.1 Port={free_port()} CPUs=2 State=UNKNOWN" for n in nodes)
    return f"""\
ClusterName=gptcore-test
SlurmctldHost={nodes[0]}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_interval=1,bf_interval=1
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=600
{node_lines}
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class Cluster:
    """munged, slurmctld and a slurmd per node, in `folder`; `run` a client command against them."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.nodes, self.daemons = folder, node_names(), []
        for sub in ("state", "spool"):
            (folder / sub).mkdir()
        (folder / "slurm.conf").write_text(slurm_conf(folder, self.nodes))
        self.env = {**env(), "SLURM_CONF": str(folder / "slurm.conf")}
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.start(["munged", "--foreground", "--force", f"--socket={folder}/munge.socket", f"--key-file={key}",
                    f"--log-file={folder}/munged.log", f"--pid-file={folder}/munged.pid",
                    f"--seed-file={folder}/munged.seed"], "munged")
        self.wait_for(lambda: (folder / "munge.socket").exists(), "munged's socket")
        self.start(["slurmctld", "-D", "-f", str(folder / "slurm.conf")], "slurmctld")
        for node in self.nodes:
            self.start(["slurmd", "-D", "-N", node, "-f", str(folder / "slurm.conf")], f"slurmd-{node}")
        self.wait_for(self.idle, "both nodes idle")

    def start(self, cmd: list[str], name: str) -> None:
        out = open(self.folder / f"{name}.out", "w")
        self.daemons.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                             start_new_session=True))
        out.close()

    def wait_for(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while not ready():
            if time.time() > deadline or any(d.poll() is not None for d in self.daemons):
                logs = "".join(p.read_text(errors="replace")[-1500:] for p in sorted(self.folder.glob("*.out")))
                pytest.fail(f"SLURM: no {what} within {timeout:.0f} s\n{logs}")
            time.sleep(0.2)

    def idle(self) -> bool:
        """Whether every node is idle: no job on it, nothing of one still ending."""
        return self.run("sinfo", "-h", "-N", "-o", "%T", check=False).split() == ["idle"] * len(self.nodes)

    def logs(self) -> str:
        """The end of each daemon's log, for a failure's message."""
        return "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                       for p in sorted(self.folder.glob("*.log")))

    def run(self, *cmd: str, check: bool = True, cwd: Path | None = None) -> str:
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60, cwd=cwd)
        assert out.returncode == 0 or not check, f"{' '.join(cmd)}: {out.stderr}"
        return out.stdout

    def job(self, job: str) -> dict[str, str]:
        """`scontrol show job`'s fields."""
        return dict(re.findall(r"(\w+)=(\S*)", self.run("scontrol", "show", "job", "-o", job)))

    def stop(self) -> None:
        self.run("scancel", "--full", "--user=root", check=False)
        deadline = time.time() + 30
        while self.run("squeue", "-h", check=False).strip() and time.time() < deadline:
            time.sleep(0.5)
        for d in reversed(self.daemons):  # slurmd first, munged last
            d.send_signal(signal.SIGTERM)
            try:
                d.wait(timeout=20)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()


@pytest.fixture(scope="module")
def cluster():
    folder = Path(tempfile.mkdtemp(prefix="gptcore-slurm-"))  # short: munge's socket path has a length limit
    c = Cluster(folder)
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_gpt2_shards(tmp_path_factory.mktemp("shards"))


@pytest.fixture(scope="module")
def straight(shards, tmp_path_factory):
    """The uninterrupted run: the stage, as dvc runs it, on one node of 2 ranks."""
    project = make_project(tmp_path_factory.mktemp("straight"), shards, nproc=2, **RUN)
    run_stage(project, "train", 1)
    return project


def weights(project: Path) -> dict[str, torch.Tensor]:
    return checkpoints.load_checkpoint(project / "model" / "model.pt")["model"]


def submit(cluster: Cluster, project: Path, *options: str) -> str:
    """sbatch slurm/train.sbatch from the project folder, as a user would; the job's id."""
    return cluster.run("sbatch", "--parsable", *options, str(SCRIPT), cwd=project).strip().split(";")[0]


def log(project: Path, job: str) -> str:
    path = project / f"slurm-{job}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def warn_after_checkpoint(cluster: Cluster, project: Path, job: str, step: int) -> None:
    """Once checkpoint `step` is written and a later step logged: the time-limit warning, as --signal=B:USR1 sends
    it (to the batch script only); the job requeued."""
    loss = project / "metrics/train/plots/metrics/train_loss.tsv"
    saved = project / "checkpoints" / f"ckpt_{step:07d}"
    cluster.wait_for(lambda: (saved.exists() and loss.exists()
                              and len(loss.read_text().splitlines()) > step + 1)
                     or cluster.job(job)["JobState"] not in ("PENDING", "RUNNING"), f"checkpoint {step}", 300)
    assert cluster.job(job)["JobState"] == "RUNNING", f"the run ended before the warning:\n{log(project, job)}"
    cluster.run("scancel", "--signal=USR1", "--batch", job)
    cluster.wait_for(lambda: cluster.job(job)["Restarts"] == "1", "requeued job", 120)


def finished(cluster: Cluster, project: Path, job: str) -> dict[str, str]:
    cluster.wait_for(lambda: cluster.job(job)["JobState"] not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING"),
                     "end of the job", 600)
    fields = cluster.job(job)
    assert fields["JobState"] == "COMPLETED", f"{fields}\n{log(project, job)[-3000:]}\n{cluster.logs()}"
    return fields


@pytest.mark.parametrize("nodes,per_node", [(1, 2), (2, 1)])
def test_warned_mid_way_the_job_requeues_itself_and_ends_as_the_uninterrupted_run(cluster, shards, straight,
                                                                                  tmp_path, nodes, per_node):
    """The ranks finish their step and save it on the signal (the first run's last line says which step), and the
    requeued run resumes from that checkpoint."""
    project = make_project(tmp_path / "project", shards, nproc=per_node, **RUN)
    job = submit(cluster, project, f"--nodes={nodes}")
    warn_after_checkpoint(cluster, project, job, 8)
    fields = finished(cluster, project, job)
    said = log(project, job)
    assert fields["Restarts"] == "1" and fields["NumNodes"] == str(nodes), fields
    assert f"run 0: {nodes} node(s) of {per_node} rank(s)" in said and f"run 1: {nodes} node(s)" in said, said
    assert "[slurm] SIGUSR1 (the time-limit warning): stopping the ranks" in said and "[slurm] requeued" in said
    kept = re.search(r"\[train\] interrupted \(SIGUSR1\); saved step (\d+): a rerun resumes there", said)
    assert kept and 8 <= int(kept.group(1)) < RUN["max_steps"], said[-4000:]
    assert f"resuming from checkpoints/ckpt_{int(kept.group(1)):07d} (step {kept.group(1)})" in said, said[-4000:]
    a, b = weights(project), weights(straight)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_that_fails_on_its_own_is_not_requeued(cluster, shards, tmp_path):
    """A mistake in params.yaml: the stage's one line in the log, the job failed, no second run."""
    project = make_project(tmp_path / "project", shards, nproc=1, **{**RUN, "total_batch_tokens": 100})
    job = submit(cluster, project)
    cluster.wait_for(lambda: cluster.job(job)["JobState"] not in ("PENDING", "RUNNING", "COMPLETING"), "failure", 300)
    fields, said = cluster.job(job), log(project, job)
    assert fields["JobState"] == "FAILED" and fields["Restarts"] == "0", (fields, said)
    assert "train.total_batch_tokens" in said and "requeued" not in said, said
