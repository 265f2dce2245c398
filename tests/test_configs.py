"""Every config composes and every policy instantiates; impossible configs fail before simulating."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from dllm_offload_sim.costmodel.profile import ProfileError, shipped_profiles
from dllm_offload_sim.policies.base import Policy
from dllm_offload_sim.sim.app import run_table
from dllm_offload_sim.wiring.build import CONF_DIR, cost_model
from dllm_offload_sim.wiring.errors import ConfigError

GROUPS = {
    g: sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml"))
    for g in ("model", "trace", "hw", "policy", "sim")
}


def _compose(*overrides, app: str = "config"):
    """The simulator's config (``app="config"``) or the validator's (``app="validate"``) with ``overrides``."""
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return compose(config_name=app, overrides=list(overrides))


@pytest.mark.parametrize("name", GROUPS["policy"])
def test_every_policy_config_instantiates(name):
    cfg = _compose(f"policy={name}")
    pol = instantiate(cfg.policy)
    assert isinstance(pol, Policy) and pol.__doc__


@pytest.mark.parametrize("group", ["model", "trace", "hw", "sim"])
def test_every_group_option_composes(group):
    for opt in GROUPS[group]:
        cfg = _compose(f"{group}={opt}")
        assert cfg[group] is not None


def test_every_shipped_profile_pairs_with_its_model():
    pairs = {
        tuple(p.name.split(".")[0].rsplit("-", 1)) for p in shipped_profiles()
    }  # h100-mini.measured.json
    assert {("h100", "mini"), ("h200", "flash")} <= pairs
    for hw, model in sorted(pairs):
        assert hw in GROUPS["hw"], f"shipped profile {hw}-{model} has no conf/hw/{hw}.yaml"
        cm = cost_model(_compose(f"hw={hw}", f"model={model}"))
        assert cm.expert_h2d_seconds() > 0


def test_table_lists_existing_policies():
    assert set(_compose().table.policies) <= set(GROUPS["policy"])
    assert set(_compose(app="validate").validate.policies) <= set(GROUPS["policy"])


def test_each_app_has_its_own_config():
    """The simulator's config carries no validator settings and the validator's no simulator table."""
    sim, val = _compose(), _compose(app="validate")
    assert "validate" not in sim and "table" not in val and "sim" not in val


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")))
def test_every_experiment_composes(name):
    cfg = _compose(f"experiment={name}", app="validate" if name.startswith("validate_") else "config")
    assert cfg.trace.path  # every experiment names its trace
    if name.startswith("validate_"):
        assert cost_model(cfg).expert_bytes > 0  # its profile matches its model shape


def _small(*overrides):
    return _compose("trace.requests=[0]", "sim.per_forward=false", *overrides)


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        (["policy=lru", "cache=300"], ConfigError, "cache=300 exceeds the 256 experts"),
        (["policy=lru", "cache=0"], ConfigError, "needs cache >= 1"),
        (["policy=oled", "hw.pcie_gbps=0"], ProfileError, "hw.pcie_gbps.*positive"),
        (["policy=oled", "hw.pcie_gbps=-8"], ProfileError, "positive"),
        (["table.policies=[nonesuch]"], ConfigError, "unknown policy 'nonesuch'"),
        (["policy=lru", "model=flash", "hw.profile=h200-mini"], ConfigError, "moe_layers"),
        (["policy=lru", "hw.profile=h200-flash"], ConfigError, "choose the matching profile"),
        (["policy=oled", "policy.psi=cubic"], ConfigError, "psi must be one of"),
        (["policy=lru", "sim.batch_size=0"], ConfigError, "batch_size must be >= 1"),
        (["policy=lru", "trace.requests=[99]"], ConfigError, "no requests \\[99\\]"),
    ],
)
def test_bad_config_fails_before_simulating(overrides, error, match, monkeypatch):
    import dllm_offload_sim.sim.run as run

    calls = []
    real = run.Simulation.run
    monkeypatch.setattr(run.Simulation, "run", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    cfg = _compose(*overrides) if "trace.requests=[99]" in overrides else _small(*overrides)
    with pytest.raises(error, match=match):
        run_table(cfg, progress=False)
    assert not calls, "a simulation ran before the configuration error was raised"


def test_cache_zero_allowed_for_cpu_policies():
    t = run_table(_small("policy=ktransformers", "cache=0"), progress=False)
    assert t.cache_util.isna().all() or (t.hits == 0).all()
    assert (t.cpu_experts > 0).all()


def test_the_traces_own_shape_picks_the_model_and_profile(tmp_path):
    """model=auto (the default): a flash trace runs at flash shapes with the flash profile, without model=flash."""
    from dllm_offload_sim.traces.synth import SynthConfig, write_synthetic_trace

    p = write_synthetic_trace(
        SynthConfig(model="flash", n_requests=1, max_new_tokens=16, seed=0), tmp_path / "f"
    )
    cfg = _compose("policy=lru", f"trace.path={p}", "sim.per_forward=false")
    assert cfg.model.shape == "auto"
    from dllm_offload_sim.sim.app import run_table

    t = run_table(cfg, progress=False)
    assert (
        cfg.model.shape == "flash" and t.profile.iloc[0] == "h100-flash" and t.model.iloc[0] == "llada2-flash"
    )
    with pytest.raises(ConfigError, match="moe_layers"):  # an explicit model= still insists
        run_table(
            _compose("policy=lru", f"trace.path={p}", "model=mini", "hw.profile=h200-flash"), progress=False
        )


def test_policies_of_your_own_in_the_table(tmp_path, monkeypatch):
    """A policy outside the repository runs in table mode: its NAME.yaml in a folder of policy_dirs, or a
    registered entry point; an unknown one names both ways."""
    import textwrap

    pkg = tmp_path / "mypol"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent("""
        from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy

        class Mine(NaiveLRUPolicy):
            name = "mine"
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "confs").mkdir()
    (tmp_path / "confs" / "mine.yaml").write_text("_target_: mypol.Mine\n")
    from dllm_offload_sim.sim.app import run_table

    t = run_table(
        _compose(
            "table.policies=[naive_lru,mine]",
            "table.caches=[40]",
            f"policy_dirs=[{tmp_path / 'confs'}]",
            "trace.requests=[0]",
            "sim.per_forward=false",
        ),
        progress=False,
    )
    assert list(t.policy) == ["naive_lru", "mine"] and t.tpot_ms.iloc[0] == t.tpot_ms.iloc[1]

    import dllm_offload_sim.wiring.build as W

    monkeypatch.setattr(W, "_registered_policies", lambda: {"mine_ep": "mypol.Mine"})
    t = run_table(
        _compose(
            "table.policies=[mine_ep]", "table.caches=[40]", "trace.requests=[0]", "sim.per_forward=false"
        ),
        progress=False,
    )
    assert t.policy.tolist() == ["mine_ep"]
    with pytest.raises(ConfigError, match="policy_dirs, or a 'dllm_offload_sim.policies' entry point"):
        run_table(_compose("table.policies=[nobody]"), progress=False)


def test_a_policys_former_name_still_names_it():
    """Runs stored before ``ideal`` was renamed ``clairvoyant_coop`` name it the old way; re-predicting them builds it."""
    from dllm_offload_sim.wiring.build import FORMER_POLICY_NAMES, make_policy, policy_config, policy_names

    assert policy_config("ideal") == policy_config("clairvoyant_coop")
    assert make_policy(policy_config("ideal")).name == "clairvoyant_coop"
    known = set(policy_names())
    assert set(FORMER_POLICY_NAMES.values()) <= known and not set(FORMER_POLICY_NAMES) & known


def test_the_config_is_read_once_into_a_typed_job_spec():
    """job_spec checks every field a job uses and returns typed records; the simulator reads those, not the config."""
    from dllm_offload_sim.wiring.spec import JobSpec, PlannedRun, SimSettings, job_spec

    spec = job_spec(_compose("table.caches=[20,40]", "table.policies=[lru,oled]", "sim.batch_size=2"))
    assert isinstance(spec, JobSpec) and spec.baseline == "naive_lru" and spec.jobs == 0
    assert [(r.label, r.cache) for r in spec.runs] == [("lru", 20), ("lru", 40), ("oled", 20), ("oled", 40)]
    assert all(isinstance(r, PlannedRun) for r in spec.runs)
    assert spec.settings == SimSettings(batch_size=2, dummy_warmup=True, per_forward=True)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch_size": 0}, r"sim\.batch_size must be >= 1, got 0"),
        ({"warmup_requests": 1.5}, r"sim\.warmup_requests must be an integer, got 1\.5"),
        ({"dummy_warmup": "yes"}, r"sim\.dummy_warmup must be true or false, got 'yes'"),
        ({"cpu_workers": 0}, r"hw\.cpu_workers must be >= 1, got 0"),
        ({"seed": "0"}, r"seed must be an integer, got '0'"),
    ],
)
def test_simulate_checks_its_settings_as_a_config_is_checked(kwargs, match):
    """simulate()'s keyword arguments build the same SimSettings, so a call from Python gets the config's errors."""
    from dllm_offload_sim.costmodel import CostModel
    from dllm_offload_sim.policies.lru import LRUPolicy
    from dllm_offload_sim.sim.run import simulate
    from dllm_offload_sim.traces.shipped import default_trace_path

    with pytest.raises(ConfigError, match=match):
        simulate(default_trace_path(), LRUPolicy(), 40, CostModel("h100-mini"), **kwargs)


def test_each_default_policy_selection_is_what_docs_policies_says():
    """One list of policies (conf/policy/); each command's default is a selection from it, as docs/policies.md's
    "Which policies run where" states."""
    from dllm_offload_sim.validate.e2e import DEFAULT_POLICIES
    from dllm_offload_sim.wiring.build import make_policy, policy_config
    from dllm_offload_sim.policies.base import ClairvoyantPolicy

    shipped = set(GROUPS["policy"])
    table = _compose().table.policies
    assert set(table) == shipped - {"oled_paper", "clairvoyant_model"} and len(table) == len(set(table))
    pol = {n: make_policy(policy_config(n)) for n in shipped}
    deployable = {n for n, p in pol.items() if not isinstance(p, ClairvoyantPolicy) and n != "oled_paper"}
    assert set(_compose(app="validate").validate.policies) == deployable | {"clairvoyant_coop"}
    e2e = DEFAULT_POLICIES.split(",")
    assert set(e2e) <= deployable and not any(pol[n].prefetches or pol[n].reads_own_confidence for n in e2e)
    for f in sorted((CONF_DIR / "experiment").glob("*.yaml")):  # a figure's sweep names shipped policies only
        for line in f.read_text().splitlines():
            key, _, value = line.strip().partition(":")
            if key == "policy":
                assert set(value.strip().split(",")) <= shipped, (f.name, line)
