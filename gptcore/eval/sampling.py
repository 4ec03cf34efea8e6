"""Text samples from a trained checkpoint or OpenAI's weights, decoded with the run's own tokenizer.

CLI (nanoGPT's sample.py as a console script; docs/export-and-sampling.md):
    gptcore-sample --model model --prompt "ROMEO:" --num-samples 3 --max-new-tokens 200
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

import torch

from gptcore.atomic import write_text
from gptcore.data.tokenizers.base import Tokenizer
from gptcore.device import DEVICE_RULES, DTYPE_RULES, autocast_context, pick_device, resolve_dtype
from gptcore.errors import UserError, one_line_errors
from gptcore.model.gpt import GPT
from gptcore.model.load import load_model, tokenizer_for
from gptcore.params import Param, ParamError
from gptcore.user_files import read_utf8


def read_prompt(prompt: str) -> str:
    """`FILE:path` reads the prompt from a file (as nanoGPT's sample.py); anything else is the prompt itself."""
    if not prompt.startswith("FILE:"):
        return prompt
    path = Path(prompt[5:])
    if path.is_dir():
        raise UserError(f"prompt file {path} is a folder (from --prompt {prompt!r}): name a text file")
    if not path.is_file():
        raise UserError(f"prompt file {path} not found (from --prompt {prompt!r})")
    return read_utf8(path)


def sample(model: GPT, tokenizer: Tokenizer, prompt: str = "", num_samples: int = 1, max_new_tokens: int = 100,
           temperature: float = 0.8, top_k: int | None = 200, seed: int = 1337, device: torch.device | str = "cpu",
           dtype: torch.dtype | None = None) -> list[str]:
    """`num_samples` continuations of `prompt` (or of end-of-text), decoded; `dtype`: autocast's (None: fp32)."""
    device = torch.device(device)
    ids = (tokenizer.encode(read_prompt(prompt)) if prompt else []) or [tokenizer.eot]
    ids = ids[-model.config.block_size :]
    x = torch.tensor([ids] * num_samples, dtype=torch.long, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    if next(model.parameters()).device != device:  # .to() on an FSDP model would reshard its gathered root
        model = model.to(device)
    with autocast_context(device, dtype):
        out = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen,
                             vocab_limit=tokenizer.vocab_size)
    return [tokenizer.decode(row[len(ids):].tolist()) for row in out]


def write_samples(path: Path, prompt: str, texts: list[str], model_spec: str) -> None:
    """Generated samples as a small text file (atomic), prompt shown once per sample."""
    write_text(path, "".join(f"--- sample {i} ({model_spec}) ---\n{prompt}{t}\n\n" for i, t in enumerate(texts)))


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes (an unknown option, `--num-samples two`) are a UserError: one line, exit 1."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (gptcore-sample --help lists the options)")


# the options after --prompt, each checked as params are (one line naming the option, the value and what is allowed)
OPTIONS = {
    "num_samples": Param(int, 3, min=1),
    "max_new_tokens": Param(int, 200, min=1),
    "temperature": Param(float, 0.8, min=0.0, what="a number >= 0 (0: always the most likely token)"),
    "top_k": Param(int, 200, "0: sample from all tokens", min=0, what="an integer >= 0 (0: all tokens)"),
    "seed": Param(int, 1337, min=0),
    "device": Param(str, **DEVICE_RULES),
    "dtype": Param(str, **DTYPE_RULES),
}


def main(argv: list[str] | None = None) -> None:
    """gptcore-sample: print samples from a model spec (see gptcore.model.load); a mistake is one line, exit 1."""
    with one_line_errors("gptcore-sample"):
        _main(argv)


def _main(argv: list[str] | None) -> None:
    ap = _Parser(prog="gptcore-sample", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="model", help="model/ folder, checkpoint .pt, HF GPT-2 folder or "
                                                     "gpt2[-medium|-large|-xl]")
    ap.add_argument("--tokenizer-dir", default=None, help="folder with manifest.json (default: beside the model)")
    ap.add_argument("--prompt", default="", help="prompt text, or FILE:path")
    for name, param in OPTIONS.items():
        ap.add_argument("--" + name.replace("_", "-"), type=param.kind, default=param.default, help=param.doc or None)
    args = ap.parse_args(argv)
    for name, param in OPTIONS.items():
        try:
            setattr(args, name, param.check("--" + name.replace("_", "-"), getattr(args, name)))
        except ParamError as e:  # the option's name says where the value came from, not params.yaml
            raise UserError(str(e)) from None
    prompt = read_prompt(args.prompt)  # a missing prompt file is refused before the model loads
    try:
        device = pick_device(args.device, key="--device")
    except ParamError as e:  # as above: an option, not a key of params.yaml
        raise UserError(str(e)) from None
    if args.tokenizer_dir is not None and not Path(args.tokenizer_dir).is_dir():
        raise UserError(f"--tokenizer-dir={args.tokenizer_dir}: no such folder")
    model = load_model(args.model)
    tok = tokenizer_for(args.model, model, args.tokenizer_dir)
    texts = sample(model, tok, args.prompt, args.num_samples, args.max_new_tokens, args.temperature,
                   args.top_k or None, args.seed, device, resolve_dtype(args.dtype, device))
    for i, text in enumerate(texts):
        print(f"--- sample {i} ---\n{prompt}{text}")


if __name__ == "__main__":
    main()
