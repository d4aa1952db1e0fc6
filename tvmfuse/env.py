"""Every TVMFUSE_* environment variable, declared and read here only."""

import os
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parent.parent

#: Root of the per-target tuning databases (``<root>/<target-key>/database_*.json``).
TUNING_LOGS = Path(os.environ.get("TVMFUSE_TUNING_LOGS", _REPO_ROOT / "tuning_logs"))

#: Log level of the CLI (DEBUG, INFO, WARNING, ...).
LOG_LEVEL = os.environ.get("TVMFUSE_LOG_LEVEL", "INFO").upper()
