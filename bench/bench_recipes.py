"""Every documented recipe, run as written: each command block of README.md, docs/ and examples/, timed.

    python bench/bench_recipes.py                      # every block this machine can run, in this environment
    python bench/bench_recipes.py --venv /tmp/wheelenv # against another install (CI: a wheel in an empty venv)
    python bench/bench_recipes.py --list               # what would run, and what is skipped and why
    python bench/bench_recipes.py --only docs/figures.md --keep /tmp/recipes   # one page; keep its folders

A command block is a fenced ``bash``/``sh``/``console`` block. Each page's blocks run in order in folders of
their own, so a block may use what an earlier block on the same page made (a trace, a sweep):

- in an empty temporary folder, as a user of the installed package would run them (the default);
- or in a fresh copy of the repository's tracked files, for blocks that run the checkout's scripts
  (``python notebooks/figures.py``, ``bash validation/regenerate.sh``).

A comment on the line before a block's fence says how to treat it (Markdown renders it as nothing):

    <!-- recipe: checkout -->          run in a fresh copy of the checkout
    <!-- recipe: gpu -->               needs a CUDA GPU: run only where torch sees one
    <!-- recipe: cluster -->           needs a SLURM or Ray cluster: listed, never run here
    <!-- recipe: inputs -->            needs inputs of one's own (a checkpoint, a dataset): listed, never run here
    <!-- recipe: ci -->                the test command itself, which .ci/run runs
    <!-- recipe: file PATH -->         (before a python/yaml block) write the block to PATH in the page's folders

Each block prints its wall time beside any time the block states (``145 s`` in a comment), with the machine, so
the documented times are measured by this script. Exit status 1 when a block fails; its output is in the log
folder (``--keep``, or a temporary one that is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/*.md", "examples/*.md")
COMMAND_LANGS = {"bash", "sh", "console", "shell"}
RUN_MODES = {"run", "checkout"}
SKIP_MODES = {
    "gpu": "needs a CUDA GPU",
    "cluster": "needs a SLURM or Ray cluster",
    "inputs": "needs inputs of one's own (a checkpoint, a dataset, a GPU host's data)",
    "ci": "the test command, run by .ci/run itself",
}
MARKER = re.compile(r"^\s*<!--\s*recipe:\s*(\S+)(?:\s+(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)[^`]*$")
STATED = re.compile(r"\b(\d[\d,]*(?:\.\d+)?) ?s\b")


@dataclass
class Block:
    """One fenced block of a page: where it is, its language, its text and how to treat it."""

    page: str
    line: int
    lang: str
    text: str
    mode: str  # run | checkout | gpu | cluster | ci | file
    arg: str = ""  # the path of a ``file`` block

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def stated(self) -> list[str]:
        """Times the block's text states (``145 s``), to print beside the measured one."""
        return [m.group(0) for m in STATED.finditer(self.text)]

    def commands(self) -> list[str]:
        """The block's commands: its lines with continuations (a trailing backslash) joined, blank and comment-only
        lines left out."""
        out, cur = [], ""
        for ln in self.text.splitlines():
            cur = f"{cur}\n{ln}" if cur else ln
            if ln.endswith("\\"):
                continue
            if cur.strip() and not cur.lstrip().startswith("#"):
                out.append(cur)
            cur = ""
        if cur.strip():
            out.append(cur)
        return out

    def timed_script(self, stamps: str) -> str:
        """The block as one bash script that appends ``INDEX EPOCHREALTIME`` to ``stamps`` before each command and
        after the last, so each command's wall time is the difference of two stamps (the commands share one shell:
        a variable or folder an earlier line makes is there for the next)."""
        cmds = self.commands()
        stamp = f'printf "%s %s\\n" {{}} "$EPOCHREALTIME" >> {shlex.quote(stamps)}'
        lines = [part for i, c in enumerate(cmds) for part in (stamp.format(i), c)]
        return "\n".join(lines + [stamp.format(len(cmds))]) + "\n"


@dataclass
class Result:
    where: str
    mode: str
    status: str  # ok | failed | skipped | same
    seconds: float | None = None
    stated: list[str] = field(default_factory=list)
    note: str = ""
    lines: list[dict] = field(
        default_factory=list
    )  # {command, seconds, comment} of each command that states a time


class RecipeError(ValueError):
    """A page's markers or fences that this script cannot read."""


def parse_page(path: Path, page: str) -> list[Block]:
    """The command blocks and ``file`` blocks of one Markdown page, in order.

    Raises RecipeError naming the page and line for an unknown marker, a marker on a block it cannot apply to,
    or a fence that is never closed.
    """
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, lang = m.group(1), m.group(2), m.group(3).lower()
        end = i + 1
        while end < len(lines) and not re.match(rf"^\s*{ticks}\s*$", lines[end]):
            end += 1
        if end == len(lines):
            raise RecipeError(f"{page}:{i + 1}: a fence opened here is never closed")
        body = [ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1 : end]]
        prev = i - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        marker = MARKER.match(lines[prev]) if prev >= 0 else None
        mode, arg = (marker.group(1), marker.group(2) or "") if marker else ("", "")
        if mode and mode not in RUN_MODES | set(SKIP_MODES) | {"file"}:
            raise RecipeError(
                f"{page}:{prev + 1}: unknown recipe marker {mode!r}; "
                f"one of {sorted(RUN_MODES | set(SKIP_MODES) | {'file'})}"
            )
        if mode == "file":
            if not arg:
                raise RecipeError(
                    f"{page}:{prev + 1}: 'recipe: file' needs the path to write, e.g. 'file conf/x.yaml'"
                )
            blocks.append(Block(page, i + 1, lang, "\n".join(body) + "\n", "file", arg))
        elif lang in COMMAND_LANGS:
            blocks.append(Block(page, i + 1, lang, "\n".join(body) + "\n", mode or "run"))
        elif mode:
            raise RecipeError(
                f"{page}:{prev + 1}: marker {mode!r} on a {lang or 'plain'} block; it applies to bash blocks"
            )
        i = end + 1
    return blocks


def pages(root: Path, only: list[str] | None = None) -> list[str]:
    """The pages this script reads, relative to root, in a stable order (README first)."""
    found: list[str] = []
    for pattern in PAGES:
        found += sorted(str(p.relative_to(root)) for p in root.glob(pattern))
    if only:
        missing = [o for o in only if o not in found]
        if missing:
            raise RecipeError(f"--only: no such page {missing[0]!r}; pages: {', '.join(found)}")
        found = [p for p in found if p in only]
    return found


def all_blocks(root: Path, only: list[str] | None = None) -> list[Block]:
    return [b for page in pages(root, only) for b in parse_page(root / page, page)]


def has_cuda(env: dict) -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return (
            subprocess.run(["python", "-c", probe], env=env, capture_output=True, timeout=120).returncode == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def copy_checkout(root: Path, dest: Path) -> None:
    """A fresh copy of the repository's tracked files (what a clone holds)."""
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for f in filter(None, files):
        src = root / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def environment(venv: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    bindir = Path(venv).resolve() / "bin" if venv else Path(sys.executable).parent
    if venv:
        env["VIRTUAL_ENV"] = str(Path(venv).resolve())
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                cpu = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}"


def run_blocks(blocks: list[Block], work: Path, env: dict, timeout_s: float, gpu: bool) -> list[Result]:
    """Runs the blocks in order; each page gets its own empty folder and its own checkout copy."""
    results: list[Result] = []
    passed: dict[tuple[str, str], str] = {}
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for b in blocks:
        slug = re.sub(r"[^A-Za-z0-9]+", "_", b.page).strip("_")
        folders = {"run": work / slug / "empty", "checkout": work / slug / "checkout"}
        if b.mode == "file":
            for mode, folder in folders.items():
                if mode == "checkout" and not folder.exists():
                    continue
                (folder / b.arg).parent.mkdir(parents=True, exist_ok=True)
                (folder / b.arg).write_text(b.text, encoding="utf-8")
            continue
        if b.mode in SKIP_MODES and not (b.mode == "gpu" and gpu):
            results.append(Result(b.where, b.mode, "skipped", stated=b.stated, note=SKIP_MODES[b.mode]))
            continue
        mode = "checkout" if b.mode == "checkout" else "run"
        key = (mode, b.text)
        if key in passed:
            results.append(
                Result(b.where, b.mode, "same", note=f"the same block as {passed[key]}, which passed")
            )
            continue
        folder = folders[mode]
        if not folder.exists():
            folder.mkdir(parents=True)
            if mode == "checkout":
                copy_checkout(REPO, folder)
        log = logs / f"{slug}_{b.line}.log"
        stamps = logs / f"{slug}_{b.line}.stamps"
        stamps.unlink(missing_ok=True)
        live = sys.stdout.isatty()
        if live:
            print(f"{b.where:28} {b.mode:9} ...", end="", flush=True)
        t0 = time.perf_counter()
        with open(log, "w") as fh:
            try:
                rc = subprocess.run(
                    ["bash", "-e", "-o", "pipefail", "-c", b.timed_script(str(stamps))],
                    cwd=folder,
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=timeout_s,
                ).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        dt = time.perf_counter() - t0
        ok = rc == 0
        note = "" if ok else f"exit {rc}; log {log}" + (" (timed out)" if rc == 124 else "")
        results.append(
            Result(b.where, b.mode, "ok" if ok else "failed", dt, b.stated, note, line_times(b, stamps))
        )
        line = f"{b.where:28} {b.mode:9} {dt:8.1f} s  {'ok' if ok else 'FAILED'}  {' '.join(b.stated)}"
        print(("\r" if live else "") + line, flush=True)
        if ok:
            passed[key] = b.where
        else:
            tail = log.read_text(errors="replace").splitlines()[-15:]
            print("    " + "\n    ".join(tail), flush=True)
    return results


def line_times(b: Block, stamps: Path) -> list[dict]:
    """Each command of ``b`` that states a time in its comment, with the wall time it took (from the stamps the timed
    script wrote; a command that did not finish is left out)."""
    try:
        at = {int(i): float(t) for i, t in (ln.split() for ln in stamps.read_text().splitlines())}
    except (OSError, ValueError):
        return []
    out = []
    for i, cmd in enumerate(b.commands()):
        comment = cmd.split(" #", 1)[1].strip() if " #" in cmd else ""
        if STATED.search(comment) and i + 1 in at:
            out.append(
                {
                    "command": cmd.split(" #", 1)[0].strip(),
                    "seconds": round(at[i + 1] - at[i], 1),
                    "comment": comment,
                }
            )
    return out


def table(results: list[Result]) -> str:
    rows = ["| block | mode | status | measured | stated in the block | note |", "|---|---|---|---|---|---|"]
    for r in results:
        sec = f"{r.seconds:.1f} s" if r.seconds is not None else ""
        rows.append(f"| {r.where} | {r.mode} | {r.status} | {sec} | {', '.join(r.stated)} | {r.note} |")
    timed = [(r.where, ln) for r in results for ln in r.lines]
    if timed:
        rows += ["", "| block | command | measured | what the docs state |", "|---|---|---|---|"]
        rows += [f"| {w} | `{ln['command']}` | {ln['seconds']:.1f} s | {ln['comment']} |" for w, ln in timed]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    ap.add_argument(
        "--venv", help="run the blocks with this virtual environment's commands (default: this one's)"
    )
    ap.add_argument(
        "--only", nargs="+", metavar="PAGE", help="only these pages (e.g. README.md docs/figures.md)"
    )
    ap.add_argument(
        "--list", action="store_true", help="list the blocks and how each is treated; run nothing"
    )
    ap.add_argument("--keep", metavar="DIR", help="run in DIR (kept) instead of a temporary folder")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds one block may take (default 1800)")
    ap.add_argument("--json", metavar="FILE", help="also write the results here")
    args = ap.parse_args(argv)
    try:
        blocks = all_blocks(REPO, args.only)
    except RecipeError as e:
        print(f"bench_recipes: {e}", file=sys.stderr)
        return 2
    if args.list:
        for b in blocks:
            extra = f" -> {b.arg}" if b.mode == "file" else ""
            print(
                f"{b.where:28} {b.mode:9}{extra}  {b.text.strip().splitlines()[0][:70] if b.text.strip() else ''}"
            )
        return 0
    env = environment(args.venv)
    gpu = has_cuda(env)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="recipes-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}; GPU: {'yes' if gpu else 'no'}; folders and logs: {work}", flush=True)
    t0 = time.perf_counter()
    results = run_blocks(blocks, work, env, args.timeout, gpu)
    print(f"\n{table(results)}\n\nmachine: {machine()}; {time.perf_counter() - t0:.0f} s in all")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": machine(), "results": [asdict(r) for r in results]}, indent=1)
        )
    failed = [r for r in results if r.status == "failed"]
    if failed:
        print(f"{len(failed)} block(s) failed: {', '.join(r.where for r in failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
