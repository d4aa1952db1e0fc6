"""The build folder: the library, ``manifest.json`` and ``check.npz``, written beside their final
place and swapped in only when whole (and, when asked, verified), so a failed build leaves an
earlier one untouched. :mod:`tvmfuse.runtime` reads what this writes.
"""

from __future__ import annotations

import datetime
import errno
import glob
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import __version__, runtime
from .errors import TvmfuseError
from .tuning import database as tuning_db

if TYPE_CHECKING:  # the CLI checks -o with this module before torch and TVM are loaded
    from .compiler import Compiled
    from .frontend import ImportedModel

log = logging.getLogger(__name__)


def check_destination(out_dir: str | Path) -> Path:
    """``out_dir`` if a build can be written there, else a TvmfuseError saying why: checked
    before compiling, so a bad ``-o`` costs no compile."""
    out_dir = Path(out_dir)
    if out_dir.is_symlink():  # the swap would replace the link, not the build it points to
        raise TvmfuseError(f"{out_dir} is a symbolic link; name the folder it points to "
                           f"({out_dir.resolve()}) as -o")
    here = Path.cwd().resolve()
    if out_dir.resolve() == here or out_dir.resolve() in here.parents:
        raise TvmfuseError(f"-o {out_dir} is the current folder or one above it, which a build "
                           f"would replace whole; name a folder of its own, e.g. -o build")
    if out_dir.exists() and not out_dir.is_dir():
        raise TvmfuseError(f"{out_dir} is a file, not a folder; choose another -o")
    if out_dir.is_dir() and not (out_dir / runtime.MANIFEST).is_file():
        raise TvmfuseError(f"{out_dir} exists and is not a tvmfuse build; choose another -o")
    parent = out_dir.parent  # the build is staged beside out_dir: its parent must be writable
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TvmfuseError(f"cannot write into {parent}: permission denied; choose another -o")
    return out_dir


def build(compiled: Compiled, out_dir: str | Path,
          check: Callable[[Path], object] | None = None) -> Path:
    """Write the deployable library and its ``manifest.json`` into ``out_dir``.

    The folder is written beside its final place and swapped in at the end, after ``check``
    (called with the staged folder, e.g. to verify it) has returned, so a failed build or check
    leaves any earlier build there untouched.
    """
    out_dir = check_destination(out_dir)
    _remove_dead_stagings(out_dir)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.{os.getpid()}.",
                                        dir=out_dir.parent))
    except OSError as err:
        if _disk_full(err):
            raise _no_space(out_dir) from err
        raise
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the build from other users
    try:
        with compiled.times.measure("export"):
            compiled.target.export(compiled.executable, str(staging / runtime.LIBRARY))
        with compiled.times.measure("reference"):
            _write_check(compiled.model, staging / runtime.CHECK)
        manifest = _manifest(compiled, staging)
        (staging / runtime.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if check is not None:
            check(staging)
        _swap_in(staging, out_dir)
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        if _disk_full(err):
            raise _no_space(out_dir) from err
        raise
    log.info("wrote %s", out_dir)
    return out_dir


#: How a full disk reads in a message that is not an OSError: the linker's ("ld: final link
#: failed: No space left on device", inside TVM's RuntimeError or a CalledProcessError's output).
_NO_SPACE = os.strerror(errno.ENOSPC)


def _disk_full(err: BaseException) -> bool:
    """Whether ``err`` says a disk is full: an ENOSPC OSError (the manifest, ``check.npz``, a
    ``--verify`` record), or a linker whose output says so (TVM links with g++ into the staging
    folder; its objects go to the temporary folder, whose filling LLVM itself reports)."""
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return True
    said = [str(err), getattr(err, "output", None), getattr(err, "stderr", None)]
    return any(_NO_SPACE in (s.decode(errors="replace") if isinstance(s, bytes) else s)
               for s in said if s)


def _no_space(out_dir: Path) -> TvmfuseError:
    """The one line for a full disk: the staging folder is gone and an earlier build is intact,
    both by the time this is raised."""
    return TvmfuseError(f"cannot write the build {out_dir}: {_NO_SPACE} (nothing was changed "
                        f"there); free space on its disk or choose another -o")


def _remove_dead_stagings(out_dir: Path) -> None:
    """Remove the staging folders (``.NAME.PID.XXXX``) and swapped-out builds (``.NAME.old-PID``)
    that builds into ``out_dir`` left when they were killed (SIGKILL, power loss): their PID no
    longer runs. A folder of a build still running is left alone."""
    pattern = re.compile(rf"\.{re.escape(out_dir.name)}\.(?:old-)?(\d+)(?:\.[\w-]+)?")
    for folder in out_dir.parent.glob(f".{glob.escape(out_dir.name)}.*"):
        found = pattern.fullmatch(folder.name)
        if found is None or folder.is_symlink() or not folder.is_dir():
            continue
        pid = int(found.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            log.info("removed %s, left by a build that was killed", folder)
        except PermissionError:
            pass  # another user's process runs under that PID


def _write_check(model: ImportedModel, path: Path) -> None:
    """Save the example inputs and the reference's outputs on them, for ``tvmfuse run --check``
    on a device that has no PyTorch."""
    if model.reference is None:
        return
    outputs = model.reference(*model.example_inputs)
    np.savez(path, **{f"input:{s.name}": a for s, a in zip(model.inputs, model.example_inputs)},
             **{f"output:{s.name}": a for s, a in zip(model.outputs, outputs)})


def _swap_in(staging: Path, out_dir: Path) -> None:
    if out_dir.exists() and not (out_dir / runtime.MANIFEST).is_file():
        raise TvmfuseError(f"{out_dir} exists and is not a tvmfuse build; choose another -o")
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        out_dir.rename(old)
    staging.rename(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _manifest(compiled: Compiled, folder: Path) -> dict:
    import tvm  # noqa: PLC0415 - see the TYPE_CHECKING imports

    model, target = compiled.model, compiled.target
    return {
        "tvmfuse_version": __version__,
        "tvm_version": tvm.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {"source": model.source, "kind": model.kind},
        "target": {"name": target.name, "key": target.key, "config": target.config,
                   "description": target.description},
        "library": runtime.LIBRARY,
        # what runtime.load checks before it maps the library (a truncated one is a SIGBUS);
        # check.npz is not pinned: a user may replace the reference it holds
        "files": {runtime.LIBRARY: runtime.file_digest(folder / runtime.LIBRARY)},
        # what the build depends on (tvmfuse.reuse): the same build again keeps this folder
        "build_key": compiled.build_key,
        "source_key": compiled.source_key,
        # float16: a fp16 build, its inputs and outputs float32 (see `tvmfuse build --dtype`);
        # verification accepts that precision's error
        "precision": compiled.precision,
        "inputs": [s.to_json() for s in model.inputs],
        "outputs": [s.to_json() for s in model.outputs],
        # the largest size of each bounded symbolic dimension ({"seq": 512}), checked per run
        "bounds": dict(model.bounds),
        "kernels": len(compiled.analysis.kernels),
        "fusion_groups": [g.to_json() for g in compiled.analysis.groups],
        "database": _database_json(compiled.analysis.databases),
        "databases": [_database_json((d,)) for d in compiled.analysis.databases],
        "untuned_kernels": (sorted(set(compiled.analysis.untuned))
                            if compiled.analysis.databases else None),
        # Kernel -> "tuned", the hand-written schedule rule ("cpu.conv2d"), or "default".
        "implementations": dict(sorted(compiled.analysis.implementations.items())),
        "compile_seconds": round(compiled.seconds, 2),
        # seconds per stage, import to export (see tvmfuse.buildtime), and the wall time
        "build_seconds": compiled.times.to_json(),
    }


def _database_json(databases: tuple[Path, ...]) -> dict | None:
    """The first database a build applied (the user's where there are two), with its digest."""
    if not databases:
        return None
    return {"path": str(databases[0]), "sha256": tuning_db.digest(databases[0])}
