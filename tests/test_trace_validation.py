"""Bad traces are refused with an error naming the file, the column and the first bad row."""

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_offload_sim.traces.errors import TraceError, TraceFormatError
from dllm_offload_sim.traces.reader import Trace


@pytest.fixture
def trace_copy(small_trace, tmp_path):
    dst = tmp_path / "t"
    shutil.copytree(small_trace, dst)
    return dst


def _rewrite(path, fname, fn, schema=None):
    t = pq.read_table(path / fname)
    t = fn(t)
    pq.write_table(t, path / fname) if schema is None else pq.write_table(t.cast(schema), path / fname)


def _set(t, name, values):
    i = t.schema.get_field_index(name)
    return t.set_column(
        i, t.schema.field(i).with_type(values.type) if hasattr(values, "type") else name, values
    )


def _read_all(path):
    Trace.open(path).validate()


def test_missing_meta(trace_copy):
    (trace_copy / "meta.json").unlink()
    with pytest.raises(TraceFormatError, match=r"meta\.json: missing"):
        _read_all(trace_copy)


def test_missing_table(trace_copy):
    (trace_copy / "tokens.parquet").unlink()
    with pytest.raises(TraceFormatError, match=r"tokens\.parquet: missing table"):
        _read_all(trace_copy)


def test_missing_directory(tmp_path):
    with pytest.raises(TraceError, match="no such trace directory"):
        Trace.open(tmp_path / "nope")


def test_wrong_schema_version(trace_copy):
    m = json.loads((trace_copy / "meta.json").read_text())
    m["schema_version"] = 99
    (trace_copy / "meta.json").write_text(json.dumps(m))
    with pytest.raises(TraceFormatError, match=r"meta\.json, column 'schema_version'.*99"):
        _read_all(trace_copy)


def test_truncated_parquet(trace_copy):
    f = trace_copy / "routing.parquet"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(TraceFormatError, match=r"routing\.parquet: unreadable Parquet"):
        _read_all(trace_copy)


def test_corrupt_parquet(trace_copy):
    f = trace_copy / "steps.parquet"
    f.write_bytes(b"PAR1" + b"\x00" * 100)
    with pytest.raises(TraceFormatError, match=r"steps\.parquet: unreadable Parquet"):
        _read_all(trace_copy)


def test_expert_id_out_of_range(trace_copy):
    def fn(t):
        ids = t.column("expert_ids").combine_chunks().flatten().to_numpy().copy()
        ids[8 * 5 + 3] = 256
        return t.set_column(4, "expert_ids", pa.FixedSizeListArray.from_arrays(pa.array(ids, pa.int16()), 8))

    _rewrite(trace_copy, "routing.parquet", fn)
    with pytest.raises(
        TraceFormatError, match=r"routing\.parquet, column 'expert_ids', row 5: expert id out of range"
    ):
        _read_all(trace_copy)


@pytest.mark.parametrize("a, b", [(0, 1), (2, 7), (6, 7)])
def test_repeated_expert_in_a_row(trace_copy, a, b):
    def fn(t):
        ids = t.column("expert_ids").combine_chunks().flatten().to_numpy().copy()
        ids[8 * 9 + b] = ids[8 * 9 + a]
        return t.set_column(4, "expert_ids", pa.FixedSizeListArray.from_arrays(pa.array(ids, pa.int16()), 8))

    _rewrite(trace_copy, "routing.parquet", fn)
    with pytest.raises(
        TraceFormatError, match=r"routing\.parquet, column 'expert_ids', row 9: repeated expert"
    ):
        _read_all(trace_copy)


def test_k_mismatch(trace_copy):
    def fn(t):
        for name, typ in (("expert_ids", pa.int16()), ("gate_weights", pa.float32())):
            v = t.column(name).combine_chunks().flatten().to_numpy().reshape(-1, 8)[:, :6].ravel()
            t = t.set_column(
                t.schema.get_field_index(name), name, pa.FixedSizeListArray.from_arrays(pa.array(v, typ), 6)
            )
        return t

    _rewrite(trace_copy, "routing.parquet", fn)
    with pytest.raises(TraceFormatError, match=r"column 'expert_ids'.*6 entries but meta top_k is 8"):
        _read_all(trace_copy)


def test_non_contiguous_steps(trace_copy):
    def fn(t):
        s = t.column("step").to_numpy().copy()
        s[s >= 3] += 1
        return t.set_column(1, "step", pa.array(s, pa.int32()))

    _rewrite(trace_copy, "steps.parquet", fn)
    with pytest.raises(TraceFormatError, match=r"steps\.parquet, column 'step', row 3: .*not contiguous"):
        _read_all(trace_copy)


def test_nan_gate_weight(trace_copy):
    def fn(t):
        w = t.column("gate_weights").combine_chunks().flatten().to_numpy().copy()
        w[8 * 17] = np.nan
        return t.set_column(
            5, "gate_weights", pa.FixedSizeListArray.from_arrays(pa.array(w, pa.float32()), 8)
        )

    _rewrite(trace_copy, "routing.parquet", fn)
    with pytest.raises(TraceFormatError, match=r"column 'gate_weights', row 17"):
        _read_all(trace_copy)


def test_negative_size(trace_copy):
    def fn(t):
        v = t.column("kv_len").to_numpy().copy()
        v[2] = -16
        return t.set_column(6, "kv_len", pa.array(v, pa.int32()))

    _rewrite(trace_copy, "steps.parquet", fn)
    with pytest.raises(TraceFormatError, match=r"column 'kv_len', row 2: value -16 is below 0"):
        _read_all(trace_copy)


def test_negative_prompt_len(trace_copy):
    m = json.loads((trace_copy / "meta.json").read_text())
    m["requests"][1]["prompt_len"] = -3
    (trace_copy / "meta.json").write_text(json.dumps(m))
    with pytest.raises(TraceFormatError, match=r"column 'requests.prompt_len', row 1"):
        Trace.open(trace_copy)


def test_missing_routing_row(trace_copy):
    _rewrite(trace_copy, "routing.parquet", lambda t: t.filter(pa.array(np.arange(t.num_rows) != 40)))
    with pytest.raises(TraceFormatError, match=r"routing\.parquet.*missing"):
        _read_all(trace_copy)


def test_nan_confidence_allowed_but_out_of_range_not(trace_copy):
    Trace.open(trace_copy).validate()  # the fixture already has NaN confidences for prompt rows

    def fn(t):
        c = t.column("confidence").to_numpy(zero_copy_only=False).copy()
        c[30] = 1.5
        return t.set_column(3, "confidence", pa.array(c, pa.float32()))

    _rewrite(trace_copy, "tokens.parquet", fn)
    with pytest.raises(TraceFormatError, match=r"tokens\.parquet, column 'confidence', row 30"):
        _read_all(trace_copy)


# ---- property-based fuzzing: any corruption gives a TraceFormatError or a valid trace, nothing else
COLUMNS = {
    "steps.parquet": ["step", "block", "step_in_block", "n_tokens", "kv_len", "n_decoded"],
    "routing.parquet": ["step", "layer", "row"],
    "tokens.parquet": ["step", "row"],
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fname=st.sampled_from(sorted(COLUMNS)), data=st.data())
def test_fuzz_reader(small_trace, tmp_path_factory, fname, data):
    dst = tmp_path_factory.mktemp("fuzz") / "t"
    shutil.copytree(small_trace, dst)
    t = pq.read_table(dst / fname)
    mode = data.draw(st.sampled_from(["value", "drop", "dup", "ids"]))
    if mode == "value":
        col = data.draw(st.sampled_from(COLUMNS[fname]))
        i = data.draw(st.integers(0, t.num_rows - 1))
        v = t.column(col).to_numpy().astype(np.int64).copy()
        v[i] = data.draw(st.integers(-5, 3000))
        t = t.set_column(t.schema.get_field_index(col), col, pa.array(v).cast(t.schema.field(col).type))
    elif mode == "drop":
        i = data.draw(st.integers(0, t.num_rows - 1))
        t = t.filter(pa.array(np.arange(t.num_rows) != i))
    elif mode == "dup":
        i = data.draw(st.integers(0, t.num_rows - 1))
        t = pa.concat_tables([t, t.slice(i, 1)])
    else:
        t = pq.read_table(dst / "routing.parquet")
        ids = t.column("expert_ids").combine_chunks().flatten().to_numpy().copy()
        i = data.draw(st.integers(0, ids.shape[0] - 1))
        ids[i] = data.draw(st.integers(-3, 300))
        t = t.set_column(4, "expert_ids", pa.FixedSizeListArray.from_arrays(pa.array(ids, pa.int16()), 8))
        fname = "routing.parquet"
    pq.write_table(t, dst / fname)
    try:
        tr = Trace.open(dst)
        for r in tr.requests():
            r.check_shapes()
            assert (r.ids >= 0).all() and (r.ids < 256).all()
    except TraceFormatError as e:
        # the error names a file of this trace (a bad n_tokens may surface in the routing table)
        assert e.file.startswith(str(dst)) and e.file.rsplit("/", 1)[1] in COLUMNS


def test_trace_check_names_every_broken_request_and_summarises_a_clean_one(trace_copy, capsys):
    """dllm-trace-check reads every request; each broken one is listed with its file, column and row, the others
    are still checked, and a clean trace gets dllm-stats' summary."""
    from dllm_offload_sim.traces.check import main as check

    assert check([str(trace_copy)]) == 0
    out = capsys.readouterr().out
    assert "no problems" in out and "adjacent_overlap" in out

    rid = pq.read_table(trace_copy / "routing.parquet", columns=["request_id"]).column(0).to_numpy()
    first, last = int(np.argmax(rid == rid.min())), int(np.argmax(rid == rid.max()))

    def fn(t):
        ids = t.column("expert_ids").combine_chunks().flatten().to_numpy().copy()
        w = t.column("gate_weights").combine_chunks().flatten().to_numpy().copy()
        ids[8 * first] = 999
        w[8 * last + 2] = np.nan
        t = t.set_column(4, "expert_ids", pa.FixedSizeListArray.from_arrays(pa.array(ids, pa.int16()), 8))
        return t.set_column(
            5, "gate_weights", pa.FixedSizeListArray.from_arrays(pa.array(w, pa.float32()), 8)
        )

    _rewrite(trace_copy, "routing.parquet", fn)
    assert check([str(trace_copy), "--no-stats"]) == 1
    out = capsys.readouterr().out
    assert f"routing.parquet, column 'expert_ids', row {first}: expert id out of range" in out
    assert f"routing.parquet, column 'gate_weights', row {last}" in out
    assert "2 of " in out and "requests have a problem" in out
    assert check([str(trace_copy / "nowhere")]) == 2
