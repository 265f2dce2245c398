"""A trace whose tables disagree is refused with the file, column and row (the audit's N-TR23, N-TR27, N-TR28,
N-TR29, N-TR37, N-TR39): before, each gave a silently wrong TPOT or statistic."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dllm_offload_sim.traces.errors import TraceFormatError
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.synth import SynthConfig, write_synthetic_trace


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return write_synthetic_trace(
        SynthConfig(n_requests=3, max_new_tokens=32, seed=0), tmp_path_factory.mktemp("c") / "t"
    )


def _edited(base, tmp_path, fname, edit):
    """A copy of ``base`` whose table ``fname`` is ``edit(table) -> table`` (schema kept)."""
    t = tmp_path / "t"
    shutil.copytree(base, t)
    table = pq.read_table(t / fname)
    pq.write_table(edit(table).cast(table.schema), t / fname)
    return t


def _set(table, name, values):
    return table.set_column(
        table.schema.get_field_index(name), name, pa.array(values, table.schema.field(name).type)
    )


def _read_all(path):
    tr = Trace.open(path)
    return [tr.request(r) for r in tr.request_ids]


@pytest.mark.parametrize("scale", [pytest.param(0, id="N-TR27"), pytest.param(10, id="N-TR28")])
def test_n_decoded_that_disagrees_with_the_decoded_rows_is_refused(base, tmp_path, scale):
    t = _edited(
        base,
        tmp_path,
        "steps.parquet",
        lambda tb: _set(tb, "n_decoded", np.asarray(tb.column("n_decoded")) * scale),
    )
    with pytest.raises(TraceFormatError, match=r"steps.parquet, column 'n_decoded', row \d+: .* marks"):
        _read_all(t)


def test_n_tr29_an_impossible_kv_len_is_refused(base, tmp_path):
    def huge(tb):
        kv = np.asarray(tb.column("kv_len")).astype(np.int64)
        kv[3] = 2_000_000_000
        return _set(tb, "kv_len", kv)

    t = _edited(base, tmp_path, "steps.parquet", huge)
    with pytest.raises(TraceFormatError, match=r"column 'kv_len', row 3: .*kv_len 2000000000 exceeds"):
        _read_all(t)


@pytest.mark.parametrize("fname", ["steps.parquet", "routing.parquet", "tokens.parquet"])
def test_n_tr23_rows_of_a_request_meta_json_does_not_list_are_refused(base, tmp_path, fname):
    t = _edited(base, tmp_path, fname, _relabel_request_2)
    with pytest.raises(TraceFormatError, match=rf"{fname}, column 'request_id': holds rows of request 7"):
        Trace.open(t)


def _relabel_request_2(tb):  # request 2's rows become a request 7 that meta.json does not list
    rid = np.asarray(tb.column("request_id")).copy()
    rid[rid == 2] = 7
    return _set(tb, "request_id", rid)


@pytest.mark.parametrize(
    "fname,edit,column",
    [
        pytest.param(
            "steps.parquet",
            lambda tb: _set(tb, "n_decoded", np.asarray(tb.column("n_decoded")) * 10),
            "n_decoded",
            id="N-TR37",
        ),
        pytest.param("steps.parquet", _relabel_request_2, "request_id", id="N-TR39"),
    ],
)
def test_dllm_stats_refuses_them_too(base, tmp_path, capsys, fname, edit, column):
    from dllm_offload_sim.traces.cli import run_cli
    from dllm_offload_sim.traces.stats import main as stats

    t = _edited(base, tmp_path, fname, edit)
    assert run_cli(stats, [str(t), "--no-plots", "--out", str(tmp_path / "st"), "--json"]) == 2
    err = capsys.readouterr().err
    assert f"column '{column}'" in err, err
    assert not (tmp_path / "st").exists()
