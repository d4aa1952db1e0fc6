"""A build folder reused when nothing that made it changed: ``tvmfuse build`` run again with the
same model, options, target, tuning records and tvmfuse keeps the library it wrote last time
instead of compiling it again.

The key is the SHA-256 of everything a build's library depends on: the imported model's Relax
module (its structure and every weight: TVM's structural hash, 0.2 s for BERT-base's 436 MB),
the build options, the target's configuration, the contents of the tuning databases it applies
and of an int8 build's calibration inputs, and the versions of TVM and of tvmfuse's own source
(every file of the package, the schedules included). The manifest keeps the key beside the
library's size; a folder whose manifest holds the same key and whose library has that size is
the build the command would write (``tvmfuse run`` checks the library's digest when it loads
it); keeping it adds ``kept`` to the manifest (when, and that build's seconds per stage).
``--no-cache`` compiles afresh.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import logging
import os
from pathlib import Path

from . import runtime
from .tuning import database as tuning_db
from .tuning import lookup

log = logging.getLogger(__name__)

#: The package's source files whose contents enter the key: code, rules and the schedules.
_SOURCES = (".py", ".toml")
#: Options that do not change the library (where IR dumps go; whether the kernel cache is read).
_NOT_IN_KEY = ("dump_ir", "cache")


def build_key(model, target, options) -> str:
    """The SHA-256 of what the build of ``model`` for ``target`` with ``options`` depends on."""
    import tvm  # noqa: PLC0415
    from tvm_ffi import structural_hash  # noqa: PLC0415

    digest = hashlib.sha256()
    settings = {name: str(value) for name, value in dataclasses.asdict(options).items()
                if name not in _NOT_IN_KEY}
    facts = {"model": structural_hash(model.mod), "inputs": [s.to_json() for s in model.inputs],
             "options": settings, "target": str(target.config), "tvm": tvm.__version__,
             "tvmfuse": source_digest()}
    digest.update(json.dumps(facts, sort_keys=True).encode())
    for database in lookup.build_databases(target, options.database, options.use_database):
        digest.update(tuning_db.digest(database).encode())
    if options.calibrate is not None:
        digest.update(Path(options.calibrate).read_bytes())
    return digest.hexdigest()


@functools.cache
def source_digest() -> str:
    """The SHA-256 of tvmfuse's source files (the schedules too), by path and contents."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    files = []
    for folder, _, names in os.walk(package, followlinks=True):  # schedules/ is a link
        files += [Path(folder, n) for n in names if n.endswith(_SOURCES)]
    for path in sorted(files, key=lambda p: p.relative_to(package).as_posix()):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def record_kept(out_dir: Path, times) -> None:
    """Note in ``out_dir``'s manifest that a build kept it, with that build's seconds per stage
    (the manifest's own ``build_seconds`` stay those of the build that wrote the library)."""
    path = out_dir / runtime.MANIFEST
    manifest = json.loads(path.read_text())
    manifest["kept"] = {
        "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "build_seconds": times.to_json()}
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(json.dumps(manifest, indent=2) + "\n")
    staged.replace(path)  # a reader sees the old manifest or the new one, whole


def unchanged(out_dir: Path, key: str) -> bool:
    """Whether ``out_dir`` holds the build whose key is ``key``, its library whole."""
    try:
        manifest = json.loads((out_dir / runtime.MANIFEST).read_text())
        size = (out_dir / runtime.LIBRARY).stat().st_size
        return manifest.get("build_key") == key and \
            manifest["files"][runtime.LIBRARY]["bytes"] == size
    except (OSError, ValueError, KeyError, TypeError):
        return False
