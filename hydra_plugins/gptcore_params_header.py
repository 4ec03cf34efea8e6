"""params.yaml's header comment, kept by `dvc exp run`, by wrapping `OmegaConf.to_yaml` for this project's params.

Why a wrapper: DVC writes params.yaml as `OmegaConf.to_yaml(cfg)` (dvc.utils.hydra.compose_and_dump), with no hook
and no way for a config to hold a comment; Hydra's plugin scan of `hydra_plugins/` imports this module just before.
Without it (another hydra.plugins_path, a DVC that writes the file otherwise) params.yaml is the same, less the header.
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
