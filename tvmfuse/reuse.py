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

A second key, the ``source_key``, is known before the import: the model's source (a zoo name or
a model file's bytes) in place of its Relax module. A build that neither verifies nor times
what it keeps compares it first, and an unchanged build is kept in well under a second, without
importing PyTorch, TVM or the model.
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

from . import env, runtime, targets
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

    facts = {"model": structural_hash(model.mod), "inputs": [s.to_json() for s in model.inputs],
             "tvm": tvm.__version__, "target": str(target.config)}
    databases = lookup.build_databases(target, options.database, options.use_database)
    return _key(facts, options, databases)


def source_key(source: str, import_arguments: dict, target_name: str | None,
               options) -> str | None:
    """The key of a build known before its model is imported, so that an unchanged build is
    kept without importing PyTorch, TVM or the model: the model's source itself (a zoo name,
    whose code is tvmfuse's and whose weights are seeded, or a ``.pt2``/``.onnx`` file's bytes),
    the import's arguments, the versions of the packages the import and the build run, the
    target's fingerprint (:func:`tvmfuse.targets.fingerprint`) and the contents of every tuning
    database the build could apply for it, and the options and tvmfuse's source as in
    :func:`build_key`. None where the source cannot be digested whole: a Python factory (its
    weights may come from anywhere) or an ONNX file that may keep its weights in files of their
    own."""
    path = Path(source)
    if path.suffix in (".pt2", ".onnx"):
        model = _file_digest(path, refuse=_ONNX_EXTERNAL_DATA if path.suffix == ".onnx" else None)
    else:
        model = None if ":" in source else f"zoo:{source}"
    target = targets.fingerprint(target_name)
    if model is None or target is None:
        return None
    identity, database_pattern = target
    facts = {"model": model, "import": import_arguments, "packages": _package_versions(),
             "target": identity}
    return _key(facts, options, _databases_matching(database_pattern, options))


def _key(facts: dict, options, databases) -> str:
    """The SHA-256 of ``facts`` and what every build depends on beside its model and target:
    the options (with the fusion rules' and the calibration inputs' contents), tvmfuse's source
    and the contents of ``databases``."""
    digest = hashlib.sha256()
    settings = {name: str(value) for name, value in dataclasses.asdict(options).items()
                if name not in _NOT_IN_KEY}
    facts = {**facts, "options": settings, "tvmfuse": source_digest(),
             "cuda_compile": env.tvm_cuda_compile_settings()}
    digest.update(json.dumps(facts, sort_keys=True, default=str).encode())
    for database in databases:
        digest.update(tuning_db.digest(database).encode())
    for path in (options.fusion_rules, options.calibrate):
        if path is not None:
            digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def _databases_matching(pattern: str, options) -> list[Path]:
    """The databases a build could apply whose folder names match ``pattern`` (the user's and
    the shipped ones), or the one ``options`` names, or none."""
    if not options.use_database:
        return []
    if options.database is not None:
        tuning_db.require(options.database)
        return [options.database]
    return [folder for root in (env.TUNING_LOGS, env.SHIPPED_TUNING_LOGS) if root.is_dir()
            for folder in sorted(root.glob(pattern)) if tuning_db.has_database(folder)]


#: How an ONNX file says a tensor's bytes are in another file: the ``location`` key of a
#: TensorProto's ``external_data`` (field 1, length 8, in protobuf's encoding).
_ONNX_EXTERNAL_DATA = b"\x0a\x08location"
#: Packages whose versions change what a model imports as or builds to.
_PACKAGES = ("apache-tvm", "apache-tvm-ffi", "torch", "torchvision", "transformers", "onnx")


def _file_digest(path: Path, refuse: bytes | None = None) -> str | None:
    """The SHA-256 of ``path``'s bytes, or None where they hold ``refuse``."""
    digest = hashlib.sha256()
    tail = b""
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 24):
            if refuse is not None and refuse in tail + chunk:
                return None
            tail = chunk[-len(refuse) + 1:] if refuse else b""
            digest.update(chunk)
    return digest.hexdigest()


def _package_versions() -> dict[str, str | None]:
    from importlib import metadata  # noqa: PLC0415

    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


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


def record_kept(out_dir: Path, seconds: dict, source_key: str | None = None) -> None:
    """Note in ``out_dir``'s manifest that a build kept it, with that build's seconds per stage
    (``BuildTimes.to_json()``; the manifest's own ``build_seconds`` stay those of the build that
    wrote the library), and the ``source_key`` it had, which the next build can keep it by
    before its import (one kept by ``build_key`` after, say, a package upgrade)."""
    path = out_dir / runtime.MANIFEST
    manifest = json.loads(path.read_text())
    if source_key is not None:
        manifest["source_key"] = source_key
    manifest["kept"] = {
        "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "build_seconds": seconds}
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(json.dumps(manifest, indent=2) + "\n")
    staged.replace(path)  # a reader sees the old manifest or the new one, whole


def unchanged(out_dir: Path, key: str, field: str = "build_key") -> bool:
    """Whether ``out_dir`` holds the build whose ``field`` (``build_key`` or ``source_key``) is
    ``key``, its library whole."""
    try:
        manifest = json.loads((out_dir / runtime.MANIFEST).read_text())
        size = (out_dir / runtime.LIBRARY).stat().st_size
        return manifest.get(field) == key and \
            manifest["files"][runtime.LIBRARY]["bytes"] == size
    except (OSError, ValueError, KeyError, TypeError):
        return False
