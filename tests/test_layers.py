"""The house's layering: packages import only packages below them, and the simulator's side never needs torch.

Layers, bottom to top (docs/design.md draws them): traces (data) -> policies (pure) -> costmodel | schedule (forwards
batched from requests, a layer's expert calls) -> wiring (configs to objects) -> sim | models -> runtime (GPU
primitives, replay) | reproduce (the paper's claims explained) -> profiler -> validate. Packages of one layer import
neither the other. The runtime does not import the simulator either: what both need is in ``schedule``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src" / "dllm_offload_sim"
NS = "dllm_offload_sim"
LAYER = {
    "traces": 0,
    "policies": 1,
    "costmodel": 2,
    "schedule": 2,
    "wiring": 3,
    "sim": 4,
    "models": 4,
    "runtime": 5,
    "reproduce": 5,
    "profiler": 6,
    "validate": 7,
}
TORCH_FREE = ["traces", "policies", "costmodel", "schedule", "wiring", "sim", "reproduce"]
APART = [("runtime", "sim")]  # (package, package it must not import although that one is lower)


def imports_of(path: Path):
    """(line, imported top-level package) for every import in ``path``, in functions too."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, package_of(a.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, package_of(node.module)


def package_of(module: str) -> str:
    """The project package a module belongs to (``dllm_offload_sim.sim.run`` -> ``sim``), else its top level."""
    parts = module.split(".")
    return parts[1] if parts[0] == NS and len(parts) > 1 else parts[0]


def upward_imports() -> list[str]:
    bad = []
    for pkg, rank in LAYER.items():
        for f in sorted((ROOT / pkg).rglob("*.py")):
            for line, mod in imports_of(f):
                if mod in LAYER and mod != pkg and LAYER[mod] >= rank:
                    bad.append(
                        f"{f.relative_to(ROOT)}:{line} ({pkg}, layer {rank}) imports {mod} (layer {LAYER[mod]})"
                    )
    return bad


def test_no_import_runs_up_or_sideways():
    assert upward_imports() == []


def test_packages_kept_apart_do_not_import_each_other():
    bad = [
        f"{f.relative_to(ROOT)}:{line} imports {mod}"
        for pkg, other in APART
        for f in sorted((ROOT / pkg).rglob("*.py"))
        for line, mod in imports_of(f)
        if mod == other
    ]
    assert bad == []


def test_every_package_has_a_layer():
    pkgs = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"conf", "tests"}
    assert pkgs <= set(LAYER), f"packages without a layer: {sorted(pkgs - set(LAYER))}"


def test_simulator_side_imports_no_torch():
    """Importing every module of the lower layers loads neither torch nor any module of an upper layer."""
    mods = [
        ".".join((NS, *f.relative_to(ROOT).with_suffix("").parts))
        for pkg in TORCH_FREE
        for f in sorted((ROOT / pkg).rglob("*.py"))
    ]
    mods = [m[: -len(".__init__")] if m.endswith(".__init__") else m for m in mods]
    code = (
        "import sys\n"
        f"for m in {mods!r}:\n    __import__(m)\n"
        "up = sorted(m for m in sys.modules if m.split('.')[:2] in "
        f"{[[NS, p] for p in sorted(set(LAYER) - set(TORCH_FREE))]!r} or m.split('.')[0] == 'torch')\n"
        "print(' '.join(up[:20]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"the simulator's side loaded: {out.stdout.strip()}"
