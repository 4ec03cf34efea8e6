"""params.yaml's header comment, kept by `dvc exp run`.

DVC composes params.yaml with Hydra (dvc.utils.hydra.compose_and_dump) and writes `OmegaConf.to_yaml` of the result,
which holds no comments. Before composing, DVC has Hydra scan the `hydra_plugins` package on `hydra.plugins_path`
(the repo root by default), which imports this module; it wraps `OmegaConf.to_yaml` so that the dump of this
project's composed params (the `preset` key and the six sections) starts with PARAMS_HEADER. Any other config dumps
as before. Nothing here is a Hydra plugin class: the module only needs to be imported. Without it (another
plugins_path, a DVC that writes params.yaml another way) params.yaml is the same, less the header;
tests/test_params_header.py checks the header through DVC's own function.
"""
from __future__ import annotations

from typing import Any

PARAMS_HEADER = """\
# Composed by `dvc exp run` (Hydra) from conf/config.yaml and conf/preset/<preset>.yaml plus the run's -S values;
# the next `dvc exp run` composes it again from conf/ (an earlier -S does not carry over), so change values with -S
# or in conf/, not here (`dvc repro` reads this file as it is). What each key means: docs/params.md.
"""
KEYS = {"preset", "fetch", "tokenize", "model", "train", "eval", "compare"}  # params.yaml's top level
_MARK = "_gptcore_params_header"


def with_header(text: str) -> str:
    """params.yaml's text with PARAMS_HEADER on top, once."""
    return text if text.startswith(PARAMS_HEADER) else PARAMS_HEADER + text


def install() -> None:
    """Wrap `OmegaConf.to_yaml` so that this project's composed params dump with PARAMS_HEADER (idempotent: Hydra's
    scan may import this module again)."""
    from omegaconf import DictConfig, OmegaConf

    if getattr(OmegaConf.to_yaml, _MARK, False):
        return
    plain = OmegaConf.to_yaml

    def to_yaml(cfg: Any, *args: Any, **kwargs: Any) -> str:
        text = plain(cfg, *args, **kwargs)
        return with_header(text) if isinstance(cfg, DictConfig) and set(cfg.keys()) == KEYS else text

    setattr(to_yaml, _MARK, True)
    OmegaConf.to_yaml = staticmethod(to_yaml)


install()
