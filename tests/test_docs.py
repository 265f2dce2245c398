"""The documentation's examples run as written, and every command it lists answers ``--help``."""

from __future__ import annotations

import re
import subprocess
import textwrap
import sys
import tomllib
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dllm_offload_sim.sim.run import simulate
from tests.simkit import flat_cost
from tests.test_sim_invariants import _trace
from dllm_offload_sim.wiring.build import make_policy

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def code_blocks(page: str, lang: str) -> list[str]:
    text = (DOCS / page).read_text()
    return [re.sub(r"^ {4}", "", b, flags=re.M) for b in re.findall(rf"```{lang}\n(.*?)```", text, re.S)]


def test_the_add_a_policy_example_runs(tmp_path, monkeypatch):
    """docs/policies.md: the FIFO class and its YAML build a policy that the simulator runs."""
    (tmp_path / "mypolicies").mkdir()
    (tmp_path / "mypolicies" / "__init__.py").write_text("")
    (tmp_path / "mypolicies" / "fifo.py").write_text(code_blocks("policies.md", "python")[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    policy = make_policy(OmegaConf.create(code_blocks("policies.md", "yaml")[0]))
    assert policy.name == "fifo"
    topo, path = _trace(tmp_path, 5)
    s = simulate(path, policy, 3, flat_cost(topo)).summary
    assert (
        s["hits"] + s["demand_copies"] == s["activations"]
        and s["demand_copies"] > 0
        and s["cpu_experts"] == 0
    )


def listed_commands() -> list[list[str]]:
    """Every console command (``dllm-*``, run as ``python -m`` its module) and ``python SCRIPT.py`` named in the
    CLI reference; a listed command that is not in ``[project.scripts]`` fails here."""
    text = (DOCS / "cli.md").read_text()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    names = sorted(set(re.findall(r"`(dllm-[a-z0-9-]+)", text)))
    unknown = [n for n in names if n not in scripts]
    assert not unknown, f"docs/cli.md names commands that pyproject.toml does not define: {unknown}"
    assert set(names) == set(scripts), (
        f"commands missing from docs/cli.md: {sorted(set(scripts) - set(names))}"
    )
    from dllm_offload_sim.commands import NEEDS_EXTRA

    targets = {
        n: NEEDS_EXTRA[n][2] if n in NEEDS_EXTRA else scripts[n] for n in names
    }  # past the extra's check
    mods = [targets[n].split(":")[0].removesuffix(".__main__") for n in names]
    files = sorted(set(re.findall(r"`python ([a-z_/]+\.py)", text)))
    return [["-m", m] for m in mods] + [[f] for f in files]


@pytest.mark.slow
@pytest.mark.parametrize("cmd", listed_commands(), ids=lambda c: c[-1])
def test_every_listed_command_has_help(cmd):
    out = subprocess.run(
        [sys.executable, *cmd, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(out.stdout) > 100
    # read as plain text in a terminal: no docstring markup, no banner naming the command twice
    assert "``" not in out.stdout and ":func:`" not in out.stdout and ":class:`" not in out.stdout
    assert "(also dllm-" not in out.stdout


@pytest.mark.slow
def test_the_add_a_policy_recipe_runs_as_written(tmp_path):
    """docs/policies.md's FIFO example, saved where it says (mypolicies/fifo.py, conf/policy/fifo.yaml in the working
    folder), runs through the console command as a single run, in the main table and in a -m sweep."""
    import shutil

    text = (DOCS / "policies.md").read_text()
    start = text.rindex("\n", 0, text.index("# mypolicies/fifo.py")) + 1  # (from the line start: dedent)
    code = textwrap.dedent(text[start : text.index("```", start)])
    conf_start = text.index("```yaml", start) + len("```yaml\n")
    conf = textwrap.dedent(text[conf_start : text.index("```", conf_start)])
    (tmp_path / "mypolicies").mkdir()
    (tmp_path / "mypolicies" / "fifo.py").write_text(code)
    (tmp_path / "conf" / "policy").mkdir(parents=True)
    (tmp_path / "conf" / "policy" / "fifo.yaml").write_text(conf)
    exe = shutil.which("dllm-sim", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the project is not installed into this interpreter's environment")
    req = "trace.requests=[0]"
    for args in (
        ["policy=fifo", "cache=40", req],
        ["table.policies=[naive_lru,fifo]", "table.caches=[40]", req],
        ["-m", "policy=fifo,naive_lru", "cache=40", req, "hydra.sweep.dir=sw"],
    ):
        p = subprocess.run(
            [exe, *args, "quiet=true"], cwd=tmp_path, capture_output=True, text=True, timeout=600
        )
        assert p.returncode == 0, p.stderr[-2000:]


def test_the_python_api_page_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/api.md's examples, run from an empty folder (the shipped trace by name: no checkout path)."""
    monkeypatch.chdir(tmp_path)
    for block in re.findall(r"```python\n(.*?)```", (DOCS / "api.md").read_text(), re.S):
        exec(compile(block, "docs/api.md", "exec"), {})
    out = capsys.readouterr().out.split()
    assert out[0] == "naive_lru" and "oled" in out
