"""Artifacts: an optimized pipeline saved as a directory that loads in a fresh process.

Layout::

    manifest.json          format, versions, groups, levels, thresholds, sha256 of every file
    pipeline.pkl           the pipeline: body, feature functions and what they close over
    models/level_<i>.pkl   one model per cascade level (the last is the full model)
    topk.pkl               the top-K filter and its held-out scores (when planned)
    sample.pkl             a few held-out input rows (request schema, stage profiling); optional
    report.json            the optimization report

Feature code from ``__main__``, a notebook, or any module that is not installed
in site-packages is stored *by value* (cloudpickle), so ``willump serve`` can load
it without the user's source. Loading executes that code: load only artifacts
you trust. Checksums catch tampering and truncation; versions are checked too.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import platform
import shutil
import sys
import sysconfig
import types
import uuid
import warnings
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import cloudpickle

from .errors import ArtifactError

FORMAT = "willump-artifact"
#: 3: certified top-K (held-out scores per class), pipelines' fit-state tokens
FORMAT_VERSION = 3
#: the manifest's HMAC-SHA256 when saved with a signing_key
SIGNATURE_FILE = "signature"
#: libraries whose version must match between save and load: name -> leading parts compared
VERSION_CHECKS = {
    "python": 2,
    "numpy": 1,
    "scipy": 1,
    "scikit-learn": 2,
    "lightgbm": 1,
    "torch": 2,
    "cloudpickle": 1,
    "pandas": 1,
}


def _library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in VERSION_CHECKS:
        if name == "python":
            continue
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _installed_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return [os.path.realpath(paths[k]) for k in ("purelib", "platlib", "stdlib", "platstdlib")]


def _is_user_module(module: ModuleType, installed: list[str]) -> bool:
    name = module.__name__
    if name == "__main__" or name.split(".")[0] == "willump":
        return False  # cloudpickle stores __main__ by value already; willump is installed
    file = getattr(module, "__file__", None)
    if file is None:
        return False
    real = os.path.realpath(file)
    return not any(real.startswith(d + os.sep) for d in installed)


#: most objects visited when looking for user modules referenced by feature code
REFERENCE_WALK_LIMIT = 10_000


def _modules_by_value(pipeline: Any) -> list[ModuleType]:
    """User modules to store by value: those defining or referenced by the feature code
    that are neither __main__ (cloudpickle's default) nor installed."""
    from ._capture import FeatureGroup

    installed = _installed_dirs()
    found: dict[str, ModuleType] = {}

    def note(module_name: str | None) -> None:
        module = sys.modules.get(module_name or "")
        if module is not None and _is_user_module(module, installed):
            found[module.__name__] = module

    for name in getattr(pipeline, "code_modules", ()):
        note(name)
    stack: list[Any] = [pipeline.fn]
    seen: set[int] = set()
    while stack and len(seen) < REFERENCE_WALK_LIMIT:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, ModuleType):
            note(obj.__name__)
        elif isinstance(obj, FeatureGroup):
            stack.append(obj.fn)
        elif isinstance(obj, types.MethodType):
            stack.extend([obj.__func__, obj.__self__])
        elif isinstance(obj, types.FunctionType):
            note(obj.__module__)
            names = _global_names(obj.__code__)
            stack.extend(obj.__globals__[n] for n in names if n in obj.__globals__)
            stack.extend(c.cell_contents for c in (obj.__closure__ or ()) if _filled(c))
            stack.extend(obj.__defaults__ or ())
        elif isinstance(obj, type):
            note(obj.__module__)
        else:
            note(type(obj).__module__)
    return [found[n] for n in sorted(found)]


def _global_names(code: types.CodeType) -> set[str]:
    """Names a code object (and the functions defined inside it) may load as globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - raises ValueError when empty
        return True
    except ValueError:
        return False


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def _by_value(pipeline: Any):
    """cloudpickle stores the pipeline's user modules by value while the block runs."""
    modules = _modules_by_value(pipeline)
    already = cloudpickle.list_registry_pickle_by_value()
    mine = [m for m in modules if m.__name__ not in already]  # nested use: only what this one added
    for module in mine:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield modules
    finally:
        for module in mine:
            cloudpickle.unregister_pickle_by_value(module)


def unpicklable_groups(pipeline: Any) -> list[tuple[str, str]]:
    """(group, error) for each captured feature group an artifact could not store."""
    found = []
    with _by_value(pipeline):
        for name, group in pipeline.graph_features().items():
            try:
                cloudpickle.dumps(group)
            except Exception as exc:
                found.append((name, f"{type(exc).__name__}: {exc}"))
    return found


def save(opt: Any, path: Any, *, signing_key: str | bytes | None = None) -> Path:
    """Write ``opt`` to directory ``path``, atomically: the artifact is written beside it and
    renamed into place, so a failed save leaves an existing artifact as it was (and leaves
    nothing behind for a first one). With ``signing_key`` the manifest (which holds every
    file's sha256) is signed (HMAC-SHA256, file ``signature``): ``load(path, trusted_key=...)``
    then refuses anything not signed with that key before it unpickles a byte."""
    from ._cascade import OptimizedPipeline

    if not isinstance(opt, OptimizedPipeline):
        raise TypeError(f"save expects an OptimizedPipeline, got {type(opt).__name__}")
    root = Path(path)
    if root.exists() and (not root.is_dir() or (not (root / "manifest.json").exists() and any(root.iterdir()))):
        raise ArtifactError(f"{root} exists and is not a willump artifact; refusing to overwrite it")
    root.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:12]
    staging = root.parent / f".{root.name}.saving-{tag}"
    try:
        _write(opt, staging)
        if signing_key is not None:
            (staging / SIGNATURE_FILE).write_text(_signature(staging / "manifest.json", signing_key))
        if root.exists():
            retired = root.parent / f".{root.name}.replaced-{tag}"
            os.replace(root, retired)
            os.replace(staging, root)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, root)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return root


def _write(opt: Any, root: Path) -> None:
    (root / "models").mkdir(parents=True)
    with _by_value(opt.pipeline) as by_value:
        files = {"pipeline.pkl": opt.pipeline}
        for i, level in enumerate(opt.levels):
            files[f"models/level_{i}.pkl"] = level.model
        if opt.topk_filter is not None:
            files["topk.pkl"] = opt.topk_filter
        if opt.sample_rows_ is not None:
            files["sample.pkl"] = opt.sample_rows_
        if len(opt.gears_) > 1:
            files["gears.pkl"] = opt.gears_[1:]
        for name, obj in files.items():
            try:
                data = cloudpickle.dumps(obj)
            except Exception as exc:
                raise ArtifactError(_pickle_failure(opt.pipeline, name, exc)) from exc
            (root / name).write_bytes(data)
    (root / "report.json").write_text(opt.report_.to_json())
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "willump_version": _willump_version(),
        "versions": _library_versions(),
        "pipeline": opt.pipeline.name,
        "groups": list(opt.pipeline.graph.groups),
        "input_columns": sorted({c for cols in opt.pipeline.graph.columns.values() for c in cols}),
        "classes": [_jsonable(c) for c in opt.classes_.tolist()],
        "levels": [
            {"groups": list(lv.groups), "model": type(lv.model).__name__, "threshold": lv.threshold,
             "file": f"models/level_{i}.pkl"}
            for i, lv in enumerate(opt.levels)
        ],
        "topk": None if opt.topk_filter is None else {
            "groups": list(opt.topk_filter.groups),
            "precision": opt.topk_filter.precision,
            "confidence": opt.topk_filter.confidence,
            "file": "topk.pkl",
        },
        "seed": opt.seed,
        "workers": opt.workers,
        "use_cache": opt.use_cache,
        "gears": [{"max_loss": g.max_loss, "loss_bound": g.loss_bound, "cert_rows": g.cert_rows,
                   "cert_disagreed": g.cert_disagreed} for g in opt.gears_[1:]],
        "sample": "sample.pkl" if opt.sample_rows_ is not None else None,
        "stored_by_value": [m.__name__ for m in by_value],
        "files": {},
    }
    for name in [*files, "report.json"]:
        manifest["files"][name] = {"sha256": _sha256(root / name), "bytes": (root / name).stat().st_size}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _pickle_failure(pipeline: Any, name: str, exc: Exception) -> str:
    """Why ``name`` could not be stored, naming the feature groups at fault when there are."""
    groups = unpicklable_groups(pipeline) if name == "pipeline.pkl" else []
    if groups:
        return ("cannot save the artifact: feature group(s) "
                + "; ".join(f"'{g}' ({why})" for g, why in groups)
                + " cannot be pickled (an open connection, a lock, a generator? create it inside "
                "the function or in the fit hook, from picklable settings)")
    return f"cannot save the artifact: {name} cannot be pickled ({type(exc).__name__}: {exc})"


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _willump_version() -> str:
    from . import __version__

    return __version__


def _signature(manifest: Path, key: str | bytes) -> str:
    secret = key.encode() if isinstance(key, str) else bytes(key)
    if not secret:
        raise ValueError("signing_key / trusted_key must not be empty")
    return hmac.new(secret, manifest.read_bytes(), hashlib.sha256).hexdigest()


def verify_signature(path: Any, key: str | bytes) -> None:
    """ArtifactError unless ``path``'s manifest is signed with ``key`` (see :func:`save`)."""
    root = Path(path)
    signature = root / SIGNATURE_FILE
    if not signature.is_file():
        raise ArtifactError(f"{root} is not signed (no {SIGNATURE_FILE}); a trusted_key was given, so it is refused")
    if not (root / "manifest.json").is_file():
        raise ArtifactError(f"{root} is not a willump artifact: its manifest is missing")
    if not hmac.compare_digest(signature.read_text().strip(), _signature(root / "manifest.json", key)):
        raise ArtifactError(f"{root}'s signature does not match trusted_key: it was altered or signed with "
                            "another key")


def read_manifest(path: Any) -> dict[str, Any]:
    """The manifest of an artifact directory, validated for format."""
    root = Path(path)
    file = root / "manifest.json"
    if not file.is_file():
        raise ArtifactError(f"{root} is not a willump artifact: {file} is missing")
    try:
        manifest = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{file} is not valid JSON ({exc}); the artifact is corrupt") from exc
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"{file} is not a willump manifest (format={manifest.get('format')!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"artifact format version {manifest.get('format_version')} is not supported by this "
            f"willump (reads version {FORMAT_VERSION}); re-create it with willump {_willump_version()}"
        )
    return manifest


def artifact_version(manifest: dict[str, Any]) -> str:
    """A short, content-derived model version: pipeline name + digest of all file checksums."""
    digest = hashlib.sha256()
    for name in sorted(manifest["files"]):
        digest.update(f"{name}:{manifest['files'][name]['sha256']};".encode())
    return f"{manifest.get('pipeline', 'pipeline')}-{digest.hexdigest()[:12]}"


def version_mismatches(saved: dict[str, str]) -> list[str]:
    """What differs, library by library, between the versions an artifact was saved with and
    those running, each with what to install. A library installed at save time but absent now
    is no mismatch: the artifact may not use it (the core install has no torch or lightgbm), and
    if it does, unpickling names it with its pip line (:func:`load`)."""
    current = _library_versions()
    problems = []
    for name, parts in VERSION_CHECKS.items():
        a, b = saved.get(name), current.get(name)
        if a is None or b is None:
            continue
        if a.split(".")[:parts] != b.split(".")[:parts]:
            fix = (f"use Python {'.'.join(a.split('.')[:2])}" if name == "python" else
                   f"pip install '{name}=={a}'")
            problems.append(f"{name} saved with {a}, running {b}: {fix}, or save the artifact again here")
    return problems


def load(path: Any, *, check_versions: bool = True, trusted_key: str | bytes | None = None) -> Any:
    """Load an artifact written by ``OptimizedPipeline.save``.

    Verifies every file's sha256 and the library versions (``check_versions=False``
    turns a version mismatch into a warning); only files the manifest lists are read. Loading
    runs the feature code stored inside: checksums catch accidents, not someone who can write
    the files. ``trusted_key`` (the ``signing_key`` it was saved with) refuses, before anything
    is unpickled, an artifact whose manifest is not signed with that key.
    """
    from ._cascade import BaselinePipeline, Gear, Level, OptimizedPipeline
    from ._report import Report

    root = Path(path)
    if trusted_key is not None:
        verify_signature(root, trusted_key)
    manifest = read_manifest(root)
    inside = root.resolve()
    for name, info in manifest["files"].items():
        file = root / name
        if inside not in (root / name).resolve().parents:
            raise ArtifactError(f"the manifest lists {name!r}, which is outside the artifact {root}")
        if not file.is_file():
            raise ArtifactError(f"artifact file {file} is missing")
        if _sha256(file) != info["sha256"]:
            raise ArtifactError(
                f"checksum mismatch for {file}: the artifact was modified or truncated after saving"
            )
    problems = version_mismatches(manifest.get("versions", {}))
    if problems:
        message = "artifact was saved with other library versions: " + "; ".join(problems)
        if check_versions:
            raise ArtifactError(message + " (load with check_versions=False to try anyway)")
        warnings.warn(message, stacklevel=2)

    def unpickle(name: str) -> Any:
        if name not in manifest["files"]:  # only what was checked is read
            raise ArtifactError(f"the manifest names {name!r} but does not list its checksum; the artifact "
                                "was altered after saving")
        try:
            with (root / name).open("rb") as fh:
                return cloudpickle.load(fh)
        except ModuleNotFoundError as exc:  # a library the artifact uses is not installed here
            from ._extras import explain_missing

            saved = manifest.get("versions", {}).get((exc.name or "").split(".")[0].replace("sklearn", "scikit-learn"))
            raise ArtifactError(f"could not load {root / name}: {explain_missing(exc, 'this artifact')}"
                                + (f" (it was saved with version {saved})" if saved else "")) from exc
        except Exception as exc:
            raise ArtifactError(f"could not load {root / name}: {type(exc).__name__}: {exc}") from exc

    pipeline = unpickle("pipeline.pkl")
    levels = []
    for spec in manifest["levels"]:
        levels.append(Level(tuple(spec["groups"]), unpickle(spec["file"]), spec["threshold"]))
    topk = unpickle(manifest["topk"]["file"]) if manifest.get("topk") else None
    report = Report.from_dict(json.loads((root / "report.json").read_text()))
    full = levels[-1].model
    import numpy as np

    classes = np.asarray(full.classes_)
    baseline = BaselinePipeline(pipeline, full, classes)
    opt = OptimizedPipeline(pipeline, levels, classes, baseline, topk, report, manifest.get("seed", 0))
    opt.sample_rows_ = unpickle(manifest["sample"]) if manifest.get("sample") else None
    opt.workers = int(manifest.get("workers", 1))
    opt.use_cache = bool(manifest.get("use_cache", True))
    if "gears.pkl" in manifest["files"]:
        opt.gears_ = [opt.gears_[0], *unpickle("gears.pkl")]
    rep = opt.report_
    if rep is not None and rep.plan == "cascade":
        opt.gears_[0] = Gear(rep.max_loss, levels, rep.loss_bound, rep.bound_method, rep.cert_rows,
                             rep.cert_disagreed, rep.calibration)
    opt.manifest_ = manifest
    return opt
