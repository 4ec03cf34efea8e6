"""Shared pytest set-up for gptcore's tests."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# make `import gptcore` work from a plain checkout (no `pip install -e .`) whatever the working directory
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
