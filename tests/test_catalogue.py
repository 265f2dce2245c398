"""The model catalogue (traces/catalogue/): every shipped model reads, LLaDA2's shapes are the ones the project has
always simulated, a model file of one's own works like a shipped one, and a bad file names its file and field."""

from __future__ import annotations

import pytest
import yaml

from dllm_offload_sim.traces.catalogue import CATALOGUE_DIR, catalogue, find_model, load_model_file
from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.topology import FLASH, MINI, topology_preset

# LLaDA2.0's shapes as the project simulated and profiled them before the catalogue existed (costmodel/profiles/)
LLADA2 = {
    "mini": dict(
        n_layers=20, n_moe=19, hidden=2048, moe_intermediate=512, n_heads=16, dense_intermediate=5120
    ),
    "flash": dict(
        n_layers=32, n_moe=31, hidden=4096, moe_intermediate=1024, n_heads=32, dense_intermediate=9216
    ),
}


def test_every_shipped_model_reads_with_its_source_and_a_unique_name():
    models = catalogue()
    assert {m.path.stem for m in models} >= {
        "mini",
        "flash",
        "qwen3-30b-a3b",
        "mixtral-8x7b",
        "olmoe-1b-7b",
        "deepseek-v2-lite",
    }
    owner: dict = {}
    for m in models:
        for n in {x.lower() for x in m.names()}:
            assert owner.setdefault(n, m.path) == m.path, f"{n!r} names both {owner[n]} and {m.path}"
    for m in models:
        assert m.source.startswith("https://huggingface.co/") and m.source.endswith("config.json"), m.path
        assert m.decoding in ("block-diffusion", "autoregressive") and m.router and m.attention, m.path
        text = m.path.read_text()
        assert text.startswith("# ") and "Source:" in text, f"{m.path}: say where the values come from"


@pytest.mark.parametrize("key", ["mini", "flash"])
def test_llada2_shapes_are_the_ones_the_profiles_were_measured_at(key):
    t, want = topology_preset(key), LLADA2[key]
    assert t is not None and t == (MINI if key == "mini" else FLASH)
    assert (
        t.n_layers,
        t.n_moe_layers,
        t.hidden,
        t.moe_intermediate,
        t.n_heads,
        t.dense_intermediate,
    ) == tuple(want.values())
    assert (t.n_experts, t.top_k, t.n_group, t.topk_group, t.n_shared_experts, t.n_kv_heads) == (
        256,
        8,
        8,
        4,
        1,
        4,
    )
    assert t.moe_layers == tuple(range(1, t.n_layers)) and t.name == f"llada2-{key}"


def test_a_model_is_found_by_name_alias_or_file_and_an_unknown_one_lists_the_catalogue(tmp_path):
    assert find_model("Qwen/Qwen3-30B-A3B").path.stem == "qwen3-30b-a3b"
    assert find_model("LLADA2.0-MINI").topology == MINI
    own = tmp_path / "tiny.yaml"
    own.write_text(
        (CATALOGUE_DIR / "olmoe-1b-7b.yaml").read_text().replace("name: olmoe-1b-7b", "name: tiny")
    )
    assert find_model(str(own)).topology.name == "tiny"
    with pytest.raises(
        TraceError, match=r"unknown model 'gpt-5'; the catalogue has .*qwen3-30b-a3b.*model file"
    ):
        find_model("gpt-5")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.pop("n_experts"), "missing field 'n_experts'"),
        (lambda d: d.update(n_expert=8), "unknown field 'n_expert'"),
        (lambda d: d.update(decoding="diffusion"), "decoding='diffusion'"),
        (lambda d: d.update(top_k=300), "top_k=300 exceeds n_experts=64"),
        (lambda d: d.update(moe_layers=[0, 1]), "exactly one of first_dense_layers and moe_layers"),
        (lambda d: d.update(first_dense_layers=-1), "first_dense_layers=-1 must be an integer >= 0"),
        (lambda d: d.update(hidden="2k"), "hidden='2k' must be an integer"),
    ],
)
def test_a_bad_model_file_names_the_file_and_field(tmp_path, edit, message):
    d = yaml.safe_load((CATALOGUE_DIR / "olmoe-1b-7b.yaml").read_text())
    edit(d)
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(d))
    with pytest.raises(TraceError, match=f"model file {f}: .*" + __import__("re").escape(message)):
        load_model_file(f)


def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    from dllm_offload_sim.wiring.build import CONF_DIR

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return compose(config_name="config", overrides=list(overrides))


def test_every_catalogue_model_is_a_model_option():
    for m in catalogue():
        assert _compose(f"model={m.path.stem}").model.shape == m.path.stem


def test_any_catalogue_shape_simulates_with_an_estimated_profile_and_is_recognised_from_its_trace(tmp_path):
    """A synthetic OLMoE trace (64 experts, top-8, every layer MoE), a roofline profile for it, the main table's
    machinery; model=auto recognises the shape, and a trace of no catalogue shape says what to do."""
    from dllm_offload_sim.costmodel.estimate import main as estimate
    from dllm_offload_sim.sim.app import run_table
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.traces.synth import SynthConfig, write_synthetic_trace
    from dllm_offload_sim.wiring.build import shape_of
    from dllm_offload_sim.wiring.errors import ConfigError

    trace = write_synthetic_trace(
        SynthConfig(model="olmoe-1b-7b", n_requests=2, max_new_tokens=32, seed=0), str(tmp_path / "t")
    )
    assert estimate(["--model", "olmoe-1b-7b", "--out", str(tmp_path)]) == 0
    profile = tmp_path / "h200-olmoe-1b-7b.estimated.json"
    cfg = _compose(
        f"trace.path={trace}",
        "hw=h200",
        f"hw.profile={profile}",
        "table.caches=[16]",
        "table.policies=[naive_lru,oled,full_residency]",
        "table.jobs=1",
    )
    table = run_table(cfg, progress=False)
    assert cfg.model.shape == "olmoe-1b-7b"  # (model=auto took the trace's shape)
    assert list(table.policy) == ["naive_lru", "oled", "full_residency"]
    by = table.set_index("policy").tpot_ms
    assert by.full_residency < by.oled < by.naive_lru
    same_slots = table[table.policy != "full_residency"]  # (full residency holds every expert, not Cache 16)
    assert (same_slots.tpot_bound_ms <= same_slots.tpot_ms).all()
    assert shape_of(Trace.open(trace)) == "olmoe-1b-7b"

    odd = tmp_path / "odd.yaml"
    odd.write_text((CATALOGUE_DIR / "olmoe-1b-7b.yaml").read_text().replace("n_experts: 64", "n_experts: 48"))
    other = write_synthetic_trace(
        SynthConfig(model=str(odd), n_requests=1, max_new_tokens=16), str(tmp_path / "o")
    )
    with pytest.raises(ConfigError, match=r"matches no catalogue model \(closest, olmoe-1b-7b: n_experts=48"):
        shape_of(Trace.open(other))


def test_the_docs_table_states_each_models_shape_as_its_file_does():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "models.md").read_text()
    rows = {
        ln.split("|")[1].strip().split()[0].strip("`"): ln for ln in text.splitlines() if ln.startswith("| `")
    }
    assert set(rows) == {m.path.stem for m in catalogue()}
    for m in catalogue():
        t = m.topology
        cells = [c.strip() for c in rows[m.path.stem].split("|")[2:-1]]
        want = [
            m.decoding,
            f"{t.n_layers} ({t.n_moe_layers} MoE)",
            str(t.n_experts),
            str(t.top_k),
            str(t.n_shared_experts),
            str(t.hidden),
            str(t.moe_intermediate),
            f"{t.expert_bytes / 2**20:.1f}",
            f"[config.json]({m.source})",
        ]
        assert cells == want, m.path.stem
