"""The wheel ships what the CPU kernels compile from: built from this tree, installed into a fresh venv (torch
and the rest from the site-packages of the Python running the tests), and the installed package builds and runs
its C++ libraries (attention.cpp and elementwise.cpp, each including vector_math.h, and grouped_matmul.cpp)."""

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs in the venv, from a directory with no sources in it: the installed package compiles the kernels into an
# empty cache and each agrees with its torch reference.
CHECK = """
import json, sys, torch
import kernels
from kernels.attention.torch_backend import TorchBackend
from kernels.cpu import attention, elementwise, grouped_matmul
from kernels.norm import rms_norm_reference

x, w = torch.randn(5, 64), torch.randn(64)
report = {"kernels": kernels.__file__, "attention": attention.supports(torch.float32, 64),
          "elementwise": elementwise.applies(x)}
if report["attention"] and report["elementwise"]:
    k_cache, v_cache, q = torch.randn(4, 16, 2, 64), torch.randn(4, 16, 2, 64), torch.randn(3, 4, 64)
    outs = []
    for backend in (attention.CpuBackend(), TorchBackend()):
        meta = backend.build_metadata([1, 2], [20, 9], [[0, 1], [2]], 16, 1, torch.device("cpu"))
        outs.append(backend.attend(q, k_cache, v_cache, meta, 0.125))
    report["attention_matches"] = torch.allclose(*outs, atol=1e-5)
    report["rms_norm_matches"] = torch.allclose(elementwise.rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6),
                                                atol=1e-5)
weight = torch.randn(2, 64, 32)
packed = grouped_matmul.pack(weight)
report["grouped_matmul_matches"] = packed is not None and torch.allclose(
    grouped_matmul.grouped_matmul(x, packed, torch.tensor([2, 5])), torch.cat([x[:2] @ weight[0], x[2:] @ weight[1]]),
    atol=1e-4)
print(json.dumps(report))
"""


def _run(command: list, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout}\n{result.stderr}"
    return result


def _copy_sources(target: Path) -> None:
    """The files git would check out (tracked or new, not ignored), as they are in the working tree: building
    in a copy leaves no build/ behind here, and no stale build/ here can slip files into the wheel."""
    listed = _run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).stdout
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # not one deleted in the working tree
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def _see_these_site_packages(python: Path) -> None:
    """torch and the rest for the venv of `python`: this interpreter's site-packages (a venv's too, which
    --system-site-packages would miss), after the venv's own, as plain paths (their .pth files, such as an
    editable install of this project, are not run there)."""
    venv_site = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    Path(venv_site, "outer_site_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")


def test_the_installed_wheel_compiles_and_runs_the_cpu_kernels(tmp_path):
    assert os.environ.get("CXX") or shutil.which("g++"), "the CPU kernels need a C++ compiler (g++ or $CXX)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", RAYLLM_KERNEL_CACHE=str(tmp_path / "cache"))
    source, wheels, venv, elsewhere = (tmp_path / name for name in ("source", "wheels", "venv", "elsewhere"))
    elsewhere.mkdir()
    _copy_sources(source)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source], env=env)
    (wheel,) = wheels.glob("rayllm_engine-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    _see_these_site_packages(python)
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", wheel], env=env)  # the tests' pip
    result = _run([python, "-c", CHECK], env=env, cwd=elsewhere)
    report = json.loads(result.stdout.splitlines()[-1])
    assert Path(report["kernels"]).is_relative_to(venv), f"imported {report['kernels']}, not the installed wheel"
    assert report["attention"] and report["elementwise"], f"a kernel did not build when installed:\n{result.stderr}"
    assert report["attention_matches"] and report["rms_norm_matches"] and report["grouped_matmul_matches"]
    built = sorted(p.name.split("-")[0] for p in (tmp_path / "cache").glob("*.so"))
    assert built == ["attention", "elementwise", "grouped_matmul"]
