"""How replicas get the artifact: by reference, never as bytes in constructor arguments.

Serve stores every deployment's constructor arguments in its controller's checkpoint and
ships them to each replica; an artifact there (megabytes of models) would be copied into
every checkpoint and every redeploy. Instead a replica receives an :class:`ArtifactSource`:

* ``path``: a directory every node of the cluster can read (a shared volume, the same
  path on every machine, a KubeRay volume). deploy uses it when a task on every alive node
  finds the artifact there with the same version, and for an in-memory pipeline when every
  node runs on this machine (saved to a temporary directory the app removes at shutdown).
* ``holder``: a detached actor pinned to the head node that keeps the artifact's files in
  memory and hands them out through Ray's object store (an in-memory pipeline, or a path
  only the driver can read). It lives until the last app using that version shuts down.

Either way the replica loads the artifact itself (checksums verified) and refuses one whose
version differs from the one planned.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import willump
from willump import OptimizedPipeline
from willump.runtime import artifact_version, read_manifest

Bundle = dict[str, bytes]


def read_bundle(path: Any) -> Bundle:
    """Every file of an artifact directory, by relative path."""
    root = Path(path)
    read_manifest(root)  # fails early and clearly for a non-artifact
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def bundle_version(bundle: Bundle) -> str:
    return artifact_version(json.loads(bundle["manifest.json"]))


def load_bundle(bundle: Bundle) -> OptimizedPipeline:
    """Write the bundle to a private temporary directory and load it from there."""
    root = Path(tempfile.mkdtemp(prefix="willump-artifact-"))
    try:
        for name, data in bundle.items():
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return willump.load(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


#: Ray namespace of the artifact holders
HOLDER_NAMESPACE = "willump"
#: prefix of the directories deploy saves an in-memory pipeline to when every node is on this machine
LOCAL_PREFIX = "willump-served-"


@dataclass(frozen=True)
class ArtifactSource:
    """Where a replica loads the artifact from, and the version it must have."""

    version: str
    path: str | None = None
    holder: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.holder is None):
            raise ValueError("an ArtifactSource names exactly one of path and holder")

    def load(self) -> OptimizedPipeline:
        if self.path is not None:
            import willump

            found = path_version(self.path)
            if found != self.version:
                raise ValueError(f"artifact at {self.path} has version {found}, expected {self.version}")
            return willump.load(self.path)
        import ray

        holder = ray.get_actor(self.holder, namespace=HOLDER_NAMESPACE)
        return load_bundle(ray.get(holder.files.remote()))

    def describe(self) -> str:
        return f"path {self.path}" if self.path is not None else f"object store (actor {self.holder})"


def path_version(path: str | os.PathLike) -> str:
    return artifact_version(read_manifest(Path(path)))


def holder_name(version: str) -> str:
    return f"willump-artifact-{version.replace(':', '-')[:40]}"


class _Holder:
    """Keeps an artifact's files (bytes by relative path) and the apps that use them."""

    def __init__(self, bundle: Bundle):
        self.bundle = bundle
        self.users: set[str] = set()

    def files(self) -> Bundle:
        return self.bundle

    def acquire(self, app: str) -> int:
        self.users.add(app)
        return len(self.users)

    def release(self, app: str) -> int:
        """Users left once ``app`` let go; -1 when ``app`` was none (a holder another deploy
        published and has not acquired yet has none, and must not end)."""
        if app not in self.users:
            return -1
        self.users.discard(app)
        return len(self.users)


def head_node_id() -> str | None:
    import ray

    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return node["NodeID"]
    return None


def publish(bundle: Bundle, app: str) -> ArtifactSource:
    """Put the artifact in a detached holder on the head node (one per version, shared by apps)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    version = bundle_version(bundle)
    name = holder_name(version)
    head = head_node_id()
    options: dict[str, Any] = {"name": name, "namespace": HOLDER_NAMESPACE, "lifetime": "detached",
                               "get_if_exists": True, "num_cpus": 0, "max_restarts": 0}
    if head is not None:  # the head outlives every worker node; the cluster ends with it
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(head, soft=False)
    holder = ray.remote(_Holder).options(**options).remote(bundle)
    ray.get(holder.acquire.remote(app))
    return ArtifactSource(version, holder=name)


def release(source: ArtifactSource, app: str) -> None:
    """The app no longer needs the artifact: a copy deploy saved for it is removed, and a
    holder ends with its last user."""
    if source.path is not None:
        parent = Path(source.path).parent
        if parent.name.startswith(f"{LOCAL_PREFIX}{app}-"):
            shutil.rmtree(parent, ignore_errors=True)
        return
    if source.holder is None:
        return
    import ray

    try:
        holder = ray.get_actor(source.holder, namespace=HOLDER_NAMESPACE)
    except ValueError:
        return
    if ray.get(holder.release.remote(app)) == 0:
        ray.kill(holder)


def release_others(source: ArtifactSource, app: str) -> None:
    """After a hand-over: ``app`` now serves ``source`` only, so every other artifact holder
    forgets it (the one it served before ends with its last user). A copy deploy saved on this
    machine goes when the deploying process exits."""
    import ray

    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor.get("name", "")
        if actor.get("namespace") == HOLDER_NAMESPACE and name.startswith(holder_name("")) and name != source.holder:
            release(ArtifactSource(source.version, holder=name), app)


def _one_machine() -> bool:
    """Every alive node runs on this machine (an embedded Ray, or raylets started here)."""
    import ray

    here = ray.util.get_node_ip_address()
    return all(n["NodeManagerAddress"] == here for n in ray.nodes() if n.get("Alive"))


def _readable_everywhere(path: str, version: str) -> list[str]:
    """Alive nodes that cannot read the artifact at ``path`` with ``version`` (empty: all can)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    here = ray.get_runtime_context().get_node_id()
    if len(nodes) == 1 and nodes[0]["NodeID"] == here:
        return []

    def probe(p: str) -> str | None:
        try:
            return path_version(p)
        except Exception:
            return None

    task = ray.remote(num_cpus=0)(probe)
    refs = {n["NodeID"]: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(path) for n in nodes}
    return [node for node, ref in refs.items() if ray.get(ref, timeout=120) != version]


def resolve(target: Any, app: str, share: str = "auto") -> tuple[ArtifactSource, OptimizedPipeline]:
    """The artifact source replicas load from, and the pipeline loaded here (for planning).

    ``share``: ``"path"`` (the path must be readable on every node), ``"object_store"``, or
    ``"auto"`` (the path when every node reads the same version there, else the object store).
    """
    import tempfile

    import willump

    if share not in ("auto", "path", "object_store"):
        raise ValueError(f"artifact_share must be 'auto', 'path' or 'object_store', got {share!r}")
    if isinstance(target, OptimizedPipeline):
        if share == "path":
            raise ValueError("artifact_share='path' needs an artifact path, not an in-memory pipeline")
        if share == "auto" and _one_machine():  # a directory here is a path every node reads
            tmp = tempfile.mkdtemp(prefix=f"{LOCAL_PREFIX}{app}-")
            atexit.register(shutil.rmtree, tmp, True)
            target.save(Path(tmp) / "artifact")
            return ArtifactSource(path_version(Path(tmp) / "artifact"), path=str(Path(tmp) / "artifact")), target
        with tempfile.TemporaryDirectory(prefix="willump-deploy-") as tmp:
            target.save(Path(tmp) / "artifact")
            bundle = read_bundle(Path(tmp) / "artifact")
        return publish(bundle, app), target
    if not isinstance(target, (str, os.PathLike)):
        raise TypeError(f"deploy expects an OptimizedPipeline or an artifact path, got {type(target).__name__}")
    path = str(Path(target).resolve())
    version = path_version(path)  # fails early and clearly for a non-artifact
    opt = willump.load(path)
    if share != "object_store":
        missing = _readable_everywhere(path, version)
        if not missing:
            return ArtifactSource(version, path=path), opt
        if share == "path":
            raise ValueError(f"artifact_share='path': nodes {missing} cannot read version {version} at {path}")
    return publish(read_bundle(path), app), opt
