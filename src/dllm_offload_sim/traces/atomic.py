"""Atomic file and directory writes: a reader never sees a half-written result.

Everything the project writes that another step reads (traces, profiles, summaries, sweep tables)
goes through these helpers: write into a temporary sibling, flush, then ``os.replace``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from dllm_offload_sim.traces.errors import TraceError


def _umask_mode(base: int) -> int:
    """``base`` permissions less the process umask (mkstemp/mkdtemp create 0600/0700 files)."""
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_file(path, write) -> Path:
    """Create ``path`` atomically: ``write(tmp_path)`` fills a temporary sibling, then a rename."""
    path = Path(path)
    if path.is_dir():
        raise TraceError(f"{path}: is a directory; refusing to write a file over it")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    with exit_on_sigterm():
        try:
            write(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, _umask_mode(0o666))
            os.replace(tmp, path)
        except BaseException as e:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if isinstance(e, OSError) and not e.filename:  # (pyarrow's and matplotlib's errors name no file)
                raise OSError(e.errno, e.strerror or str(e), str(path)) from e
            raise
    _fsync_dir(path.parent)
    return path


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same directory and a rename."""
    return atomic_write_file(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(o):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def atomic_savefig(fig, path, **kwargs) -> Path:
    """Save a matplotlib figure to ``path`` atomically (the format from its suffix). A PDF carries no creation date,
    so the same figure gives the same bytes."""
    fmt = Path(path).suffix.lstrip(".") or "png"
    if fmt == "pdf" and "metadata" not in kwargs:
        kwargs["metadata"] = {"CreationDate": None}
    return atomic_write_file(path, lambda tmp: fig.savefig(tmp, format=fmt, **kwargs))


def atomic_savefig_png_pdf(fig, stem, dpi: int = 130) -> list[Path]:
    """``fig`` saved atomically as ``stem``.png and ``stem``.pdf (their folder made where missing); both paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for p in paths:
        atomic_savefig(fig, p, dpi=dpi)
    return paths


PARQUET_ZSTD_LEVEL = 9  # traces are written once and read many times


def parquet_has_columns(path, columns) -> bool:
    """Whether ``path`` is a Parquet file whose schema holds every name of ``columns`` (a table of ours, not a file of
    the user's that merely sits where one of ours would)."""
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except Exception:  # any file pyarrow cannot read as Parquet is not ours
        return False
    return set(columns) <= names


def parquet_write_options(schema) -> dict:
    """pyarrow writer options for project tables: zstd, and byte-stream-split encoding (which makes
    float columns such as gate weights compress) on the columns whose type allows it."""
    import pyarrow as pa

    split_ok = (pa.float32(), pa.float64(), pa.int32(), pa.int64())
    cols = []
    for field in schema:
        t = field.type
        if t in split_ok:
            cols.append(field.name)
        elif pa.types.is_list(t) or pa.types.is_fixed_size_list(t):
            if t.value_type in split_ok:
                cols.append(f"{field.name}.list.element")
    return {
        "compression": "zstd",
        "compression_level": PARQUET_ZSTD_LEVEL,
        "use_dictionary": False,
        "use_byte_stream_split": cols or False,
    }


def atomic_write_parquet(path, table) -> Path:
    """Write a pyarrow Table or pandas DataFrame to ``path`` atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    return atomic_write_file(
        path, lambda tmp: pq.write_table(table, tmp, **parquet_write_options(table.schema))
    )


def check_output_dir(
    final,
    overwrite: bool = False,
    marker: str = "meta.json",
    what: str = "trace",
    owned: tuple = (),
    is_ours=None,
) -> Path:
    """Refuse an output directory whose writing could lose what the user did not ask to replace.

    Refused: a path that is a file; the current directory, one above it, or the home directory; an existing
    directory without ``overwrite``; and, with ``overwrite``, an existing directory that is neither empty
    nor a ``what`` directory: one that holds ``marker`` (for which ``is_ours(path of marker)``, where given, is
    true) and, where ``owned`` names the files a ``what`` directory holds, nothing else. Returns the path."""
    final = Path(final)
    if final.exists() and not final.is_dir():
        raise TraceError(f"{final}: is a file, not a directory; refusing to write a {what} over it")
    resolved = final.resolve()
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents or resolved == Path.home().resolve():
        raise TraceError(
            f"{final}: is the current directory, one above it or the home directory; name a new "
            f"directory for the {what}"
        )
    if final.exists():
        if not overwrite:
            raise TraceError(
                f"{final}: already exists; refusing to write over it (pass --overwrite to replace it)"
            )
        entries = sorted(p.name for p in final.iterdir())
        if entries and not (final / marker).is_file():
            raise TraceError(
                f"{final}: is not a {what} directory (no {marker}) and not empty; --overwrite "
                f"replaces only a {what} directory, so nothing was written"
            )
        if entries and is_ours is not None and not is_ours(final / marker):
            raise TraceError(
                f"{final}: its {marker} is not a {what}'s; --overwrite replaces only a {what} "
                f"directory, so nothing was written"
            )
        others = [e for e in entries if owned and e not in owned]
        if others:
            raise TraceError(
                f"{final}: holds files that are not the {what}'s ({', '.join(others[:5])}"
                f"{', ...' if len(others) > 5 else ''}); --overwrite would delete them, so nothing was "
                f"written: move them, or write the {what} elsewhere"
            )
    return final


def output_folder(path, what: str = "outputs") -> Path:
    """A folder a command writes its files into (created if missing); a path that is a file is refused, so
    nothing is written over it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise TraceError(f"{path}: is a file; --out names the folder for the {what}, so nothing was written")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_partials(final: Path) -> list[Path]:
    """Delete the temporary siblings (``.NAME.PID.*.partial`` and ``.tmp``, ``.NAME.old-PID``) that a writer of
    ``final`` killed before it could clean up left behind; a live writer's are kept. Returns what was removed."""
    final = Path(final)
    gone = []
    if not final.parent.is_dir():
        return gone
    for p in final.parent.glob(f".{final.name}.*"):
        rest = p.name[len(final.name) + 2 :]
        temp = p.name.endswith((".partial", ".tmp"))
        pid = rest[4:] if rest.startswith("old-") else (rest.split(".", 1)[0] if temp else "")
        if pid.isdigit() and not _pid_alive(int(pid)):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            gone.append(p)
    return gone


@contextlib.contextmanager
def exit_on_sigterm():
    """While the block runs (in the main thread), SIGTERM raises ``SystemExit(143)`` instead of killing the
    process outright, so the writers' clean-up runs; the previous handler comes back after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextlib.contextmanager
def atomic_directory(
    final: Path,
    overwrite: bool = False,
    marker: str = "meta.json",
    what: str = "trace",
    owned: tuple = (),
    is_ours=None,
):
    """Yield a temporary directory that becomes ``final`` only if the block finishes without error.

    ``final`` is checked first (:func:`check_output_dir`): with ``overwrite=False`` an existing ``final`` is an
    error raised *before* anything is written; with ``overwrite=True`` only an empty directory or a ``what``
    directory (holding ``marker``, and only ``owned`` where given) is replaced, and only once the new one is
    complete. Without ``overwrite``, a ``final`` that another writer completed meanwhile is not replaced: the new
    directory is moved into place by one rename that fails where ``final`` holds anything, and the write is an
    error. An error, Ctrl-C or SIGTERM removes the temporary directory; one left by a killed writer is removed by the
    next write.
    """
    final = check_output_dir(final, overwrite, marker, what, owned, is_ours)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.{os.getpid()}.", suffix=".partial", dir=final.parent))
    os.chmod(tmp, _umask_mode(0o777))
    with exit_on_sigterm():
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        old = None
        if not overwrite:
            try:  # atomic: fails where another writer's complete directory is there now
                os.rename(tmp, final)
            except OSError as e:
                shutil.rmtree(tmp, ignore_errors=True)
                raise TraceError(
                    f"{final}: another writer completed a {what} there while this one ran; it was "
                    f"kept, and this one was not written (pass --overwrite to replace it)"
                ) from e
        else:
            if final.exists():
                old = final.parent / f".{final.name}.old-{os.getpid()}"
                os.replace(final, old)
            os.replace(tmp, final)
        _fsync_dir(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
