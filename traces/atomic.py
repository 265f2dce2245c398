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

from traces.errors import TraceError


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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _umask_mode(0o666))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
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


PARQUET_ZSTD_LEVEL = 9  # traces are written once and read many times


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
    return {"compression": "zstd", "compression_level": PARQUET_ZSTD_LEVEL, "use_dictionary": False,
            "use_byte_stream_split": cols or False}


def atomic_write_parquet(path, table) -> Path:
    """Write a pyarrow Table or pandas DataFrame to ``path`` atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    return atomic_write_file(path, lambda tmp: pq.write_table(table, tmp, **parquet_write_options(table.schema)))


@contextlib.contextmanager
def atomic_directory(final: Path, overwrite: bool = False):
    """Yield a temporary directory that becomes ``final`` only if the block finishes without error.

    With ``overwrite=False`` an existing ``final`` is an error raised *before* anything is written.
    With ``overwrite=True`` the old directory is replaced only once the new one is complete.
    """
    final = Path(final)
    if final.exists() and not overwrite:
        raise TraceError(f"{final}: already exists; refusing to write over it (pass overwrite to replace it)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    os.chmod(tmp, _umask_mode(0o777))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
