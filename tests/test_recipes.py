"""Every documented command block is run as written by ``bench/bench_recipes.py`` (in CI, against a wheel install);
these tests check that the pages' blocks and markers read, that a block meant to run names no placeholder, and that
the runner runs a page's blocks in order, writes its files and reports a failure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.simkit import script_module

REPO = Path(__file__).resolve().parent.parent
recipes = script_module("bench/bench_recipes.py")
PLACEHOLDER = re.compile(r"/path/to|\bPROFILE\b|\bA\.json\b|\bDATA_DIR\b|\bDATE/TIME\b|<[a-z-]+>")


def test_every_page_reads_and_every_block_meant_to_run_names_no_placeholder():
    blocks = recipes.all_blocks(REPO)
    assert len(blocks) >= 30
    runnable = [b for b in blocks if b.mode in recipes.RUN_MODES]
    assert len(runnable) >= 15
    bad = [f"{b.where}: {m.group(0)}" for b in runnable for m in [PLACEHOLDER.search(b.text)] if m]
    assert bad == []


def test_the_readme_test_command_is_the_one_ci_runs():
    (ci_block,) = [b for b in recipes.all_blocks(REPO, ["README.md"]) if b.mode == "ci"]
    readme = ci_block.text.strip().removeprefix("python3 -m venv .venv && . .venv/bin/activate && ")
    ci = (REPO / ".ci" / "run").read_text()
    (line,) = [ln for ln in ci.splitlines() if ln.startswith("pip install") and "pytest" in ln]
    assert line.replace(" -q ", " ") == readme  # CI only quietens pip


def test_a_page_runs_in_order_with_its_files_and_a_failure_is_reported(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n<!-- recipe: file conf/x.yaml -->\n```yaml\nkey: 1\n```\n\n"
        "```bash\necho made > made.txt   # 1 s\n```\n\n"
        "```bash\ngrep -q 'key: 1' conf/x.yaml && test -f made.txt\n```\n\n"
        "<!-- recipe: gpu -->\n```bash\nnvidia-smi\n```\n\n"
        "```bash\nfalse\necho not reached\n```\n"
    )
    blocks = recipes.parse_page(page, "page.md")
    assert [b.mode for b in blocks] == ["file", "run", "run", "gpu", "run"]
    assert blocks[1].stated == ["1 s"]
    results = recipes.run_blocks(blocks, tmp_path / "work", recipes.environment(None), 60, gpu=False)
    assert [r.status for r in results] == ["ok", "ok", "skipped", "failed"]
    assert "exit 1" in results[-1].note
    (timed,) = results[0].lines  # the command that states a time, with the time it took
    assert timed["command"] == "echo made > made.txt" and timed["comment"] == "1 s" and timed["seconds"] >= 0


@pytest.mark.parametrize(
    "text, error",
    [
        ("<!-- recipe: gpus -->\n```bash\nls\n```\n", "unknown recipe marker 'gpus'"),
        ("<!-- recipe: file -->\n```yaml\na: 1\n```\n", "needs the path"),
        ("<!-- recipe: gpu -->\n```python\nprint(1)\n```\n", "applies to bash blocks"),
        ("```bash\nls\n", "never closed"),
    ],
)
def test_a_bad_marker_or_fence_names_the_page_and_line(tmp_path, text, error):
    page = tmp_path / "p.md"
    page.write_text(text)
    with pytest.raises(recipes.RecipeError, match=re.escape(error)) as e:
        recipes.parse_page(page, "p.md")
    assert str(e.value).startswith("p.md:1:")
