"""The estimators and the simulator install and import without the serving stack (the ``serve`` extra).

pyproject.toml keeps onnx, onnxruntime, aiohttp, httptools, uvloop and prometheus-client out of the core dependencies;
these tests check that the layers below ``runtime`` do not need them at import time, by importing them in
a fresh interpreter whose import system refuses those packages.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVING = ("onnx", "onnxruntime", "aiohttp", "httptools", "uvloop", "prometheus_client")
# distribution names as pyproject.toml spells them
SERVING_DISTS = {"onnx", "onnxruntime", "aiohttp", "httptools", "orjson", "uvloop", "prometheus-client", "cryptography",
                 "grpcio", "protobuf"}
# every module of these packages is imported, not only the package
WITHOUT_SERVING = ("edgemux.profiles", "edgemux.cluster", "edgemux.perf", "edgemux.policies", "edgemux.sim",
                   "edgemux.experiments")

_BLOCKER = textwrap.dedent("""
    import importlib, importlib.abc, pkgutil, sys
    BLOCKED = set(sys.argv[1].split(","))

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked: the serving stack is not installed")
            return None

    sys.meta_path.insert(0, Blocker())
    for name in sys.argv[2].split(","):
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(getattr(package, "__path__", []), name + "."):
            importlib.import_module(info.name)
    for module in BLOCKED:
        assert module not in sys.modules, f"{module} was imported"
    print("ok")
""")


def _import_blocked(modules: tuple[str, ...], blocked: tuple[str, ...] = SERVING) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _BLOCKER, ",".join(blocked), ",".join(modules)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def _dist(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def test_lower_layers_import_without_serving_stack() -> None:
    out = _import_blocked(WITHOUT_SERVING)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_blocker_can_fail() -> None:
    """The blocker does refuse what it blocks (numpy here, which the estimators need at import time)."""
    out = _import_blocked(("edgemux.perf",), blocked=("numpy",))
    assert out.returncode != 0 and "is blocked" in out.stderr


def test_serving_stack_is_an_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = {_dist(r) for r in project["dependencies"]}
    assert not core & SERVING_DISTS, f"serving packages among the core dependencies: {sorted(core & SERVING_DISTS)}"
    assert {"numpy", "scipy", "pyyaml", "matplotlib", "highspy", "networkx"} <= core
    assert {_dist(r) for r in project["optional-dependencies"]["serve"]} == SERVING_DISTS


def test_makefile_installs_the_serving_stack() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    # litert: the LiteRT backend's tests on real TFLite models; ray: the ray engine's test on a local Ray cluster
    assert "'.[serve,litert,test,bench,ray]'" in makefile


def _importers(package: str) -> list[str]:
    """The files under src/ that import ``package`` (an ``import`` or ``from`` line of it), relative to the root."""
    line = re.compile(rf"^\s*(import|from) {re.escape(package)}\b", re.M)
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src").rglob("*.py")
                  if line.search(p.read_text(encoding="utf-8")))


def test_ray_is_an_extra_that_only_the_ray_engine_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "ray" not in {_dist(r) for r in project["dependencies"]}
    assert {_dist(r) for r in project["optional-dependencies"]["ray"]} == {"ray"}
    importers = _importers("ray")
    assert importers == ["src/edgemux/engines/ray.py"], importers


def test_litert_is_an_extra_that_only_the_litert_backend_imports() -> None:
    """LiteRT is the ``litert`` extra; ``runtime.dataplane.litert`` alone imports it, and the whole runtime (the
    agent included) imports without it: an agent serving ONNX models never loads it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "ai-edge-litert" not in {_dist(r) for r in project["dependencies"]}
    assert {_dist(r) for r in project["optional-dependencies"]["litert"]} == {"ai-edge-litert"}
    importers = _importers("ai_edge_litert")
    assert importers == ["src/edgemux/runtime/dataplane/litert.py"], importers
    out = _import_blocked(("edgemux.runtime",), blocked=("ai_edge_litert", "ray"))
    assert out.returncode == 0, out.stderr


def test_grpc_is_imported_only_by_a_grpc_listener() -> None:
    """grpcio is imported by ``runtime.grpcserver`` alone, and an agent or a gateway without ``--grpc-port``
    (their modules, the CLI verbs that start them) never imports it."""
    importers = _importers("grpc")
    assert importers == ["src/edgemux/runtime/grpcserver.py"], importers
    code = ("import sys\nimport edgemux.runtime.dataplane.agent, edgemux.runtime.ingress.gateway\n"
            "import edgemux.cli.agent_cmd, edgemux.cli.gateway_cmd, edgemux.cli.up_cmd\n"
            "print(sorted(m for m in ('grpc', 'google.protobuf') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_an_edge_tpu_device_without_libedgetpu_starts_without_importing_litert() -> None:
    """Where libedgetpu is absent (most hosts), an agent's Edge TPU device is emulated without LiteRT being
    imported at start-up: only a .tflite model imports it."""
    code = ("import sys\n"
            "from edgemux.cluster.state import Device\nfrom edgemux.cluster.workload import Discipline\n"
            "from edgemux.profiles.types import DeviceKind\nfrom edgemux.runtime.dataplane.devices import default_backend\n"
            "b = default_backend(Device('n', 't', DeviceKind.EDGETPU, Discipline.FCFS, 8.0))\n"
            "print(type(b).__name__, 'ai_edge_litert' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    if out.stdout.split()[0] != "EmulatedBackend":
        pytest.skip("libedgetpu loads on this host: its Edge TPU is real")
    assert out.stdout.split() == ["EmulatedBackend", "False"], out.stdout
