"""`make release`: publish the images and the chart to an OCI registry, signed, with an SBOM beside
each image, and write what a cluster needs to verify them.

    python -m dflash_ops.release --registry HOST[:PORT]/PATH --version X --sign-key KEY \\
        --lookaside URL [--plain-http] [--images engine,sidecar,router,cpu] [--out DIR]

For each image (built before: `make images`, or `make images-local` with podman):
  1. `skopeo copy --sign-by KEY` from the local store (containers-storage or docker-daemon) to
     REGISTRY/NAME:TAG, the GPG signature written to the lookaside store (--lookaside-staging, a
     file:// URL; --lookaside is where clients read it, the same directory served over HTTP);
  2. an SBOM: the Python distributions installed in the image, listed by its own interpreter, as a
     CycloneDX document from cyclonedx-bom (`cyclonedx-py requirements`), pushed as an OCI artifact
     (artifactType application/vnd.cyclonedx+json) tagged `sha256-<image digest>.sbom` (the
     referrers tag scheme OCI 1.1 falls back on), so it is found from the image's digest.
Then the chart, its image references set to the pushed images by digest, version X, pushed with
`helm push oci://REGISTRY/charts`. OUT gets published.json (every reference and digest),
release-key.asc, policy.json (containers-policy.json(5): the images under REGISTRY must carry a
signature by that key, anything else is refused: merge its entry into a node's own policy, with
keyPath where the key is kept there) and registries.d/dflash-serve.yaml (where signatures are read).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dflash_ops.chart.helm import helm_binary
from dflash_ops.errors import UserError
from dflash_ops.paths import CHART_DIR, REPO_ROOT

SBOM_TYPE = "application/vnd.cyclonedx+json"
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
# The installed distributions, as the image's own Python sees them.
LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m; print('\\n'.join(sorted({"
    "f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions() if d.metadata['Name']})))"
)


def _version_of(pattern: str, path: Path) -> str:
    match = re.search(pattern, path.read_text(), re.M)
    if match is None:
        raise UserError(f"{path}: no {pattern!r}")
    return match.group(1)


@dataclass(frozen=True)
class Image:
    name: str  # engine, sidecar, router, cpu
    local: str  # the name `make images-local` / `make images` gives it
    remote: str  # NAME:TAG under the registry
    chart_value: str | None  # the chart's image value (repository, tag, digest), if any


def images(local_prefix: str, version: str) -> dict[str, Image]:
    built = _version_of(r'^version = "(.*)"', REPO_ROOT / "pyproject.toml")
    router = _version_of(r"^ARG VLLM_ROUTER_VERSION=(.*)$", REPO_ROOT / "docker/router.Dockerfile")
    return {
        "engine": Image("engine", f"{local_prefix}/vllm-dflash:0.33.0-dflash-{built}",
                        f"vllm-dflash:0.33.0-dflash-{version}", "image.engine"),
        "sidecar": Image("sidecar", f"{local_prefix}/sidecar:{built}", f"sidecar:{version}",
                         "image.sidecar"),
        "router": Image("router", f"{local_prefix}/vllm-router:{router}",
                        f"vllm-router:{router}-dflash-{version}", "router.image"),
        "cpu": Image("cpu", f"{local_prefix}/dflash-serve-cpu:{built}",
                     f"dflash-serve-cpu:{version}", None),
    }  # fmt: skip


def run(argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    """A tool run to completion; a missing tool or a failure is one line naming `what`."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise UserError(f"{argv[0]} not found ({what}): make setup installs it") from None
    if done.returncode != 0:
        raise UserError(f"{what} failed: {last_message(done.stderr or done.stdout)}")
    return done


def last_message(output: str) -> str:
    """A tool's last line, its msg="..." when it logs like skopeo (one line, not its retries)."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    if not lines:
        return "no output"
    found = re.search(r'msg="((?:[^"\\]|\\.)*)"', lines[-1])
    return (found.group(1).replace('\\"', '"') if found else lines[-1])[-600:]


@dataclass(frozen=True)
class Release:
    registry: str
    version: str
    sign_key: str
    lookaside: str
    lookaside_staging: str
    plain_http: bool
    source: str  # containers-storage or docker-daemon
    out: Path

    @property
    def host(self) -> str:
        return self.registry.split("/", 1)[0]

    def registries_d(self, staging: bool) -> Path:
        """registries.d(5) for the registry's host: where signatures are read (and written)."""
        directory = self.out / ("registries.d.staging" if staging else "registries.d")
        directory.mkdir(parents=True, exist_ok=True)
        entry = {"lookaside": self.lookaside}
        if staging:
            entry["lookaside-staging"] = self.lookaside_staging
        lines = ["docker:", f"  {self.registry}:"] + [f"    {k}: {v}" for k, v in entry.items()]
        (directory / "dflash-serve.yaml").write_text("\n".join(lines) + "\n")
        return directory

    def tls(self, flag: str) -> list[str]:
        return [f"--{flag}-tls-verify=false"] if self.plain_http else []

    def push_image(self, image: Image) -> str:
        """Copy and sign one image; its manifest digest."""
        with tempfile.TemporaryDirectory() as scratch:
            digest_file = Path(scratch) / "digest"
            # --remove-signatures: signatures the local copy may carry (one pulled back under a
            # policy keeps them) would forbid recompressing its layers; the release signs anew.
            run(["skopeo", "copy", "--quiet", "--retry-times", "2", "--remove-signatures",
                 *self.tls("dest"),
                 "--registries.d", str(self.registries_d(staging=True)),
                 "--sign-by", self.sign_key, "--digestfile", str(digest_file),
                 f"{self.source}:{image.local}", f"docker://{self.registry}/{image.remote}"],
                f"pushing {image.local} to {self.registry}/{image.remote}")  # fmt: skip
            return digest_file.read_text().strip()

    def sbom(self, image: Image) -> bytes:
        """The image's CycloneDX SBOM (JSON) from the distributions its Python lists."""
        engine = "podman" if self.source == "containers-storage" else "docker"
        listed = run([engine, "run", "--rm", "--network=none", "--entrypoint", "python3",
                      image.local, "-c", LIST_DISTRIBUTIONS],
                     f"listing the Python distributions in {image.local}").stdout  # fmt: skip
        generator = REPO_ROOT / ".venv-sbom" / "bin" / "cyclonedx-py"
        with tempfile.TemporaryDirectory() as scratch:
            requirements = Path(scratch) / "requirements.txt"
            requirements.write_text(listed)
            sbom = Path(scratch) / "sbom.cdx.json"
            run([str(generator), "requirements", str(requirements), "--of", "JSON",
                 "--output-reproducible", "-o", str(sbom)],
                f"cyclonedx-py for {image.local}")  # fmt: skip
            return sbom.read_bytes()

    def push_sbom(self, image: Image, digest: str, sbom: bytes) -> str:
        """The SBOM as an OCI artifact beside its image; its reference."""
        repository = image.remote.split(":", 1)[0]
        reference = f"{self.registry}/{repository}:{digest.replace(':', '-')}.sbom"
        with tempfile.TemporaryDirectory() as scratch:
            layout = Path(scratch) / "layout"
            write_artifact(layout, sbom, SBOM_TYPE, "sbom.cdx.json", subject=digest)
            run(["skopeo", "copy", "--quiet", *self.tls("dest"), f"oci:{layout}:sbom",
                 f"docker://{reference}"], f"pushing the SBOM of {image.remote}")  # fmt: skip
        return reference

    def push_chart(self, pushed: dict[str, tuple[Image, str]]) -> tuple[str, str]:
        """The chart with the images' references by digest, version self.version; its
        reference and digest."""
        helm = helm_binary()
        with tempfile.TemporaryDirectory() as scratch:
            chart = Path(scratch) / "dflash-serve"
            shutil.copytree(CHART_DIR, chart)
            values = chart / "values.yaml"
            text = values.read_text()
            for image, digest in pushed.values():
                if image.chart_value is not None:
                    repository, tag = f"{self.registry}/{image.remote}".rsplit(":", 1)
                    text = set_image(text, image.chart_value, repository, tag, digest)
            values.write_text(text)
            run([helm, "package", str(chart), "--version", self.version, "-d", scratch],
                "helm package")  # fmt: skip
            package = Path(scratch) / f"dflash-serve-{self.version}.tgz"
            plain = ["--plain-http"] if self.plain_http else []
            done = run([helm, "push", str(package), f"oci://{self.registry}/charts", *plain],
                       "helm push")  # fmt: skip
        # helm prints the digest on standard error.
        found = re.search(r"Digest: (sha256:[0-9a-f]{64})", done.stdout + done.stderr)
        return f"oci://{self.registry}/charts/dflash-serve", found.group(1) if found else ""

    def verification_files(self) -> None:
        """policy.json, registries.d and the public key a cluster verifies the images with."""
        key = run(["gpg", "--armor", "--export", self.sign_key], "exporting the signing key").stdout
        if "BEGIN PGP PUBLIC KEY BLOCK" not in key:
            raise UserError(f"--sign-key {self.sign_key}: gpg has no such key")
        (self.out / "release-key.asc").write_text(key)
        policy = {
            "default": [{"type": "reject"}],
            "transports": {
                "docker": {
                    self.registry: [{"type": "signedBy", "keyType": "GPGKeys",
                                     "keyPath": str((self.out / "release-key.asc").resolve())}]
                }
            },
        }  # fmt: skip
        (self.out / "policy.json").write_text(json.dumps(policy, indent=2) + "\n")
        self.registries_d(staging=False)


def set_image(values: str, path: str, repository: str, tag: str, digest: str) -> str:
    """values.yaml with the image block at `path` (image.engine, router.image) pointing at
    repository:tag@digest; every comment kept, as `helm show values` prints them."""
    lines = values.splitlines(keepends=True)
    keys = path.split(".")
    depth, index = 0, 0
    for key in keys:  # find each key at its indentation, in order
        while index < len(lines) and not re.match(rf"^{'  ' * depth}{key}:\s*$", lines[index]):
            index += 1
        if index == len(lines):
            raise UserError(f"charts/dflash-serve/values.yaml has no {path}")
        depth, index = depth + 1, index + 1
    indent = "  " * depth
    wanted = {"repository": repository, "tag": f'"{tag}"', "digest": f'"{digest}"'}
    while index < len(lines) and (lines[index].startswith(indent) or not lines[index].strip()):
        for field, value in wanted.items():
            if re.match(rf"^{indent}{field}:", lines[index]):
                lines[index] = f"{indent}{field}: {value}\n"
        index += 1
    return "".join(lines)


def write_artifact(
    layout: Path, payload: bytes, media_type: str, title: str, subject: str | None = None
) -> None:
    """An OCI image layout holding one artifact (`payload`, empty config), tagged `sbom`."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    manifest: dict[str, object] = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": media_type,
        "config": {"mediaType": EMPTY_CONFIG, **put(b"{}")},
        "layers": [{"mediaType": media_type, **put(payload),
                    "annotations": {"org.opencontainers.image.title": title}}],
    }  # fmt: skip
    if subject is not None:
        manifest["annotations"] = {"io.dflash-serve.sbom.subject": subject}
    descriptor = {"mediaType": OCI_MANIFEST, **put(json.dumps(manifest).encode()),
                  "annotations": {"org.opencontainers.image.ref.name": "sbom"}}  # fmt: skip
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [descriptor]}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True, help="HOST[:PORT]/PATH the images go under")
    parser.add_argument("--version", required=True, help="the release's version (chart, tags)")
    parser.add_argument("--sign-key", required=True, help="the GPG key (id or fingerprint)")
    parser.add_argument("--lookaside", required=True,
                        help="where clients read the signatures (a URL)")  # fmt: skip
    parser.add_argument(
        "--lookaside-staging", help="where signatures are written (file://; default --lookaside)"
    )
    parser.add_argument("--plain-http", action="store_true", help="a registry without TLS")
    parser.add_argument("--images", default="engine,sidecar,router,cpu")
    parser.add_argument("--source", choices=["containers-storage", "docker-daemon"],
                        default="containers-storage")  # fmt: skip
    parser.add_argument("--local-prefix", default="localhost/dflash-serve",
                        help="the built images' name prefix (make images REGISTRY=)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("release-out"))
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z.+_-]*", args.version):
        parser.error(
            f"--version {args.version!r}: a version is letters, digits, '.', '+', '_', '-'"
        )
    staging = args.lookaside_staging or args.lookaside
    if not staging.startswith("file://"):
        parser.error(f"--lookaside-staging {staging!r}: signatures are written to a file:// URL")
    catalogue = images(args.local_prefix, args.version)
    wanted = [name.strip() for name in args.images.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in catalogue]
    if unknown or not wanted:
        parser.error(f"--images {args.images!r}: choose from {', '.join(catalogue)}")
    args.out.mkdir(parents=True, exist_ok=True)
    release = Release(args.registry.rstrip("/"), args.version, args.sign_key, args.lookaside,
                      staging, args.plain_http, args.source, args.out)  # fmt: skip
    try:
        release.verification_files()
        published: dict[str, object] = {"registry": release.registry, "version": args.version}
        pushed: dict[str, tuple[Image, str]] = {}
        for name in wanted:
            image = catalogue[name]
            print(f"==> {name}: {image.local} -> {release.registry}/{image.remote}",
                  file=sys.stderr)  # fmt: skip
            digest = release.push_image(image)
            sbom = release.push_sbom(image, digest, release.sbom(image))
            pushed[name] = (image, digest)
            published[name] = {
                "reference": f"{release.registry}/{image.remote.split(':', 1)[0]}@{digest}",
                "tag": f"{release.registry}/{image.remote}",
                "sbom": sbom,
            }
        chart, chart_digest = release.push_chart(pushed)
        published["chart"] = {"reference": chart, "version": args.version, "digest": chart_digest}
    except UserError as err:
        print(f"release: {err}", file=sys.stderr)
        return 1
    (args.out / "published.json").write_text(json.dumps(published, indent=2) + "\n")
    print(json.dumps(published, indent=2))
    print(
        f"==> verify with: skopeo copy --policy {args.out}/policy.json --registries.d "
        f"{args.out}/registries.d docker://REFERENCE dir:/tmp/check",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
