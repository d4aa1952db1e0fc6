"""Which tuning databases a build applies and where ``tvmfuse tune`` writes.

Two roots, each with one folder per target key (:attr:`tvmfuse.targets.TargetSpec.key`):

- the **shipped** databases, committed under the repository's ``tuning_logs/`` and installed
  inside the package (read-only: nothing writes there unless it is named with ``--db``);
- the **user's** databases, under ``TVMFUSE_TUNING_LOGS`` or the platform's cache folder
  (:data:`tvmfuse.env.TUNING_LOGS`), where ``tvmfuse tune`` writes by default.

A build applies both, the user's records first: a kernel the user tuned takes the user's record,
any other the shipped one (:func:`tvmfuse.tuning.database.usable`).
"""

from __future__ import annotations

from pathlib import Path

from .. import env
from ..errors import TvmfuseError
from ..targets import TargetSpec
from . import database as tuning_db

#: What ``tvmfuse tune`` appends to the key of a target it measures on an emulator.
EMULATED_SUFFIX = "-emulated"


def shipped_folder(target: TargetSpec) -> Path:
    """The folder of the target's database installed with tvmfuse (it may hold none)."""
    return env.SHIPPED_TUNING_LOGS / target.key


def shipped_database(target: TargetSpec) -> Path | None:
    """The target's database installed with tvmfuse, if it holds records."""
    folder = shipped_folder(target)
    return folder if tuning_db.has_database(folder) else None


def user_database(target: TargetSpec, emulated: bool = False) -> Path:
    """Where ``tvmfuse tune`` writes by default: ``<user root>/<target-key>/``, or
    ``<target-key>-emulated/`` when it measures on an emulator."""
    return env.TUNING_LOGS / f"{target.key}{EMULATED_SUFFIX if emulated else ''}"


def default_databases(target: TargetSpec) -> tuple[Path, ...]:
    """The databases a build for ``target`` applies when none is named: the user's, then the
    shipped one, each when it holds records."""
    if env.TUNING_LOGS.exists() and not env.TUNING_LOGS.is_dir():
        raise TvmfuseError(f"TVMFUSE_TUNING_LOGS={env.TUNING_LOGS} is a file, not a folder; "
                           f"point it at a folder of tuning databases, or unset it")
    user = user_database(target)
    found = [user] if tuning_db.has_database(user) else []
    shipped = shipped_database(target)
    if shipped is not None and shipped.resolve() != user.resolve():
        found.append(shipped)
    return tuple(found)


def default_database(target: TargetSpec) -> Path | None:
    """The first of :func:`default_databases` (whose records a build prefers), or None."""
    found = default_databases(target)
    return found[0] if found else None


def build_databases(target: TargetSpec, database: Path | None,
                    use_database: bool = True) -> tuple[Path, ...]:
    """The databases a build applies: ``database`` alone when named, else the defaults; none
    when ``use_database`` is false."""
    if not use_database:
        return ()
    if database is None:
        return default_databases(target)
    if not tuning_db.has_database(database):
        raise TvmfuseError(
            f"{database} is not a tuning database: it needs {' and '.join(tuning_db.FILES)}"
        )
    return (database,)
