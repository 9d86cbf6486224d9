"""Checkpoint manifests: what a complete checkpoint holds, and checking that it still does.

A checkpoint is a directory ``step-{step:08d}-t{timeline}`` under the run's checkpoint root
(``RUN/checkpoints``). It is written under the same name plus ``.partial``; when every rank has
written its files, rank 0 writes ``manifest.json`` (step, timeline, creation time, world size,
rank 0's trainer state, and the size and sha256 of every file) and only then renames the
directory to its final name. So a published directory without a readable manifest, or whose
files no longer match it, is corrupt; a ``.partial`` one is a save that never finished.

Nothing here needs torch: these functions serve the checkpoint manager, the rewind logic and
any tool that inspects a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
PARTIAL_SUFFIX = ".partial"
DELETING_SUFFIX = ".deleting"
_NAME = re.compile(r"^step-(\d{8,})-t(\d+)$")
_CHUNK = 1 << 20


class CheckpointError(Exception):
    """A checkpoint could not be saved, verified or loaded; the message names the path and the problem."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint, as its manifest describes it (``extra`` is rank 0's trainer state)."""

    path: Path
    step: int
    timeline: int
    created: float
    world_size: int
    bytes: int
    extra: dict[str, Any]


class Skipped(NamedTuple):
    """A checkpoint passed over while looking for a good one, and why (the reason names the file)."""

    path: Path
    reason: str


@dataclass(frozen=True)
class CheckpointChoice:
    """The checkpoint to load (None when there is none) and the newer ones found corrupt on the way."""

    checkpoint: CheckpointInfo | None
    skipped: tuple[Skipped, ...] = ()

    @property
    def fell_back(self) -> bool:
        """Whether a newer checkpoint was corrupt, so that an older one was chosen."""
        return self.checkpoint is not None and bool(self.skipped)


def checkpoint_name(step: int, timeline: int) -> str:
    if step < 0 or timeline < 0:
        raise CheckpointError(f"step and timeline must be non-negative, got step={step} timeline={timeline}")
    return f"step-{step:08d}-t{timeline}"


def parse_name(name: str) -> tuple[int, int] | None:
    """``(timeline, step)`` of a published checkpoint directory name (the recency order), else None."""
    match = _NAME.match(name)
    return (int(match[2]), int(match[1])) if match else None


def list_published(root: Path) -> list[tuple[tuple[int, int], Path]]:
    """Published checkpoint directories under ``root`` as ``((timeline, step), path)``, newest first."""
    if not root.is_dir():
        return []
    found = [(key, path) for path in root.iterdir() if path.is_dir() and (key := parse_name(path.name))]
    return sorted(found, reverse=True)


def list_partial(root: Path) -> list[tuple[tuple[int, int], Path]]:
    """Unfinished saves (``*.partial`` directories) under ``root`` as ``((timeline, step), path)``."""
    if not root.is_dir():
        return []
    return [
        (key, path)
        for path in root.glob(f"*{PARTIAL_SUFFIX}")
        if path.is_dir() and (key := parse_name(path.name.removesuffix(PARTIAL_SUFFIX)))
    ]


def file_digest(path: Path) -> tuple[int, str]:
    """Size and sha256 of a file, read in chunks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def write_json_atomic(path: Path, value: Any) -> None:
    """Write ``value`` as JSON to a temporary file, fsync it, and rename it over ``path``."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w") as fh:
        json.dump(value, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temporary, path)


def fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_manifest(
    directory: Path, *, step: int, timeline: int, world_size: int, extra: dict[str, Any]
) -> CheckpointInfo:
    """Hash every file of ``directory`` and write its manifest (atomically, last)."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST):
        size, sha256 = file_digest(path)
        files[path.relative_to(directory).as_posix()] = {"size": size, "sha256": sha256}
    manifest = {
        "format": FORMAT_VERSION,
        "step": step,
        "timeline": timeline,
        "created": time.time(),
        "world_size": world_size,
        "bytes": sum(f["size"] for f in files.values()),
        "extra": extra,
        "files": files,
    }
    write_json_atomic(directory / MANIFEST, manifest)
    return _info(directory, manifest)


def read_manifest(directory: Path) -> dict[str, Any]:
    """The parsed manifest of ``directory``; CheckpointError when it is missing, unreadable or malformed."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (the save never completed)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable ({error})") from error
    problem = _malformed(manifest)
    if problem:
        raise CheckpointError(f"{path}: malformed ({problem})")
    return manifest


def _malformed(manifest: Any) -> str | None:
    if not isinstance(manifest, dict):
        return "not a JSON object"
    for key, kind in (("step", int), ("timeline", int), ("world_size", int), ("files", dict), ("extra", dict)):
        if not isinstance(manifest.get(key), kind):
            return f"{key!r} missing or not {kind.__name__}"
    for name, entry in manifest["files"].items():
        if not (
            isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
        ):
            return f"entry for {name!r} lacks size or sha256"
    return None


def verify(directory: Path) -> CheckpointInfo:
    """Check every file the manifest lists (presence, size, sha256); CheckpointError naming the first bad one."""
    manifest = read_manifest(directory)
    if parse_name(directory.name) != (manifest["timeline"], manifest["step"]):
        raise CheckpointError(
            f"{directory / MANIFEST}: says step {manifest['step']} timeline "
            f"{manifest['timeline']}, which does not match the directory name"
        )
    root = directory.resolve()
    for name, expected in sorted(manifest["files"].items()):
        path = directory / name
        if not path.resolve().is_relative_to(root):
            raise CheckpointError(f"{directory / MANIFEST}: lists {name!r}, outside the checkpoint")
        if not path.is_file():
            raise CheckpointError(f"{path}: missing")
        size, sha256 = file_digest(path)
        if size != expected["size"]:
            raise CheckpointError(f"{path}: size {size} bytes, manifest says {expected['size']}")
        if sha256 != expected["sha256"]:
            raise CheckpointError(
                f"{path}: sha256 {sha256[:16]}… does not match the manifest's {expected['sha256'][:16]}…"
            )
    return _info(directory, manifest)


def _info(directory: Path, manifest: dict[str, Any]) -> CheckpointInfo:
    return CheckpointInfo(
        path=directory,
        step=manifest["step"],
        timeline=manifest["timeline"],
        created=float(manifest.get("created", 0.0)),
        world_size=manifest["world_size"],
        bytes=int(manifest.get("bytes", 0)),
        extra=manifest["extra"],
    )


def find_latest_good(root: Path, at_or_before_step: int | None = None) -> CheckpointChoice:
    """The newest verified checkpoint (by timeline, then step) at or before a step, and the corrupt ones passed.

    The newest timeline wins over higher steps of older (abandoned) timelines.
    """
    skipped: list[Skipped] = []
    for (_, step), path in list_published(root):
        if at_or_before_step is not None and step > at_or_before_step:
            continue
        try:
            return CheckpointChoice(verify(path), tuple(skipped))
        except CheckpointError as error:
            skipped.append(Skipped(path, str(error)))
    return CheckpointChoice(None, tuple(skipped))


def retention_victims(
    root: Path,
    *,
    keep_last: int,
    milestone_every: int | None,
    published: tuple[int, int],
    is_good: Callable[[Path], bool],
) -> list[Path]:
    """Checkpoints older than the newest ``keep_last`` good ones that are not milestones, and unfinished saves
    older than the one just ``published`` (newer ones may be in flight on other ranks).

    Only checkpoints that ``is_good`` (verified) fill the ``keep_last`` places, newest first, so a corrupt
    one never pushes a verified one out; it goes once it is older than all of them. Checkpoints older
    than the last place are not asked about.
    """
    newest_first, good, older = list_published(root), 0, []
    for index, (_, path) in enumerate(newest_first):
        good += is_good(path)
        if good == keep_last:
            older = newest_first[index + 1 :]
            break
    victims = [path for (_, step), path in older if not (milestone_every and step % milestone_every == 0)]
    return victims + [path for key, path in list_partial(root) if key < published]


def leftovers(root: Path) -> list[Path]:
    """Unfinished saves and interrupted deletions: safe to remove when no save is in flight."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.suffix in (PARTIAL_SUFFIX, DELETING_SUFFIX))


def remove_tree(path: Path) -> None:
    """Delete a checkpoint directory: renamed aside first, so a half-deleted one never looks published."""
    doomed = path.with_name(path.name + DELETING_SUFFIX)
    os.replace(path, doomed)
    shutil.rmtree(doomed)
