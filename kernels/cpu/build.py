"""Compile a C++ kernel source beside this file into a shared library, once per machine, and load it.

The library is built for the CPU it runs on (`-march=native`) and kept under
`$RAYLLM_KERNEL_CACHE` (default `~/.cache/rayllm-engine/kernels`), named by a
hash of the source and the headers beside it, the compiler command, its
version, the flags and the CPU, so an edit, another compiler or another
machine sharing the directory gets its own build. Each build is written to a
temporary file of its own and renamed into place, so processes or threads that
build at once (Ray replicas, test workers) never load a half-written file.
It links OpenMP's libgomp, the one torch has already loaded, so the kernels
share torch's thread pool instead of starting a second one.
"""

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

# -fno-trapping-math: without it GCC keeps the clamp in exp_nonpositive (vector_math.h) as a branch, since
# running both sides could raise FP exceptions nobody reads, and the loops calling it (SiLU, softmax) stayed
# scalar, several times slower. It changes no result.
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
_COMPILE_TIMEOUT_S = 300


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "rayllm-engine" / "kernels"
    return Path(os.environ.get("RAYLLM_KERNEL_CACHE", default))


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """The library built from `<name>.cpp`, or None (logged) when it cannot be built here."""
    compiler = _compiler()
    if compiler is None:
        logger.warning("no C++ compiler (g++ or $CXX): the %s kernel falls back to torch", name)
        return None
    try:
        return ctypes.CDLL(str(build(Path(__file__).with_name(f"{name}.cpp"), compiler)))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        logger.warning("building the %s kernel failed, falling back to torch: %s %s", name, e,
                       detail.decode(errors="replace")[-2000:])
        return None


def build(source: Path, compiler: list[str]) -> Path:
    """The shared library for `source`, compiled unless this machine already has it; `compiler` is the
    command (with any arguments of its own, as `$CXX` may hold)."""
    version = subprocess.run([*compiler, "--version"], capture_output=True, check=True, timeout=60).stdout
    headers = [header.read_bytes() for header in sorted(source.parent.glob("*.h"))]
    key = hashlib.sha256(b"\0".join([source.read_bytes(), *headers, " ".join([*compiler, *FLAGS]).encode(),
                                     version, _cpu_identity()]))
    target = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f"{target.stem}.", suffix=".partial", dir=target.parent)
    os.close(handle)
    try:
        subprocess.run([*compiler, *FLAGS, str(source), "-o", partial], capture_output=True, check=True,
                       timeout=_COMPILE_TIMEOUT_S)
        os.replace(partial, target)
    finally:
        Path(partial).unlink(missing_ok=True)
    return target


def _compiler() -> list[str] | None:
    """`$CXX` (a command, possibly with arguments of its own), else g++ where it is installed."""
    if os.environ.get("CXX"):
        return shlex.split(os.environ["CXX"])
    found = shutil.which("g++")
    return [found] if found else None


def _cpu_identity() -> bytes:
    """What `-march=native` depends on: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor().encode()
    wanted = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(wanted)).encode()
