"""A hardware profile: the measured (or estimated) cost curves of one GPU host at one model shape.

Profiles are JSON files, versioned by ``schema_version`` and stamped with the machine they describe.
``status`` is ``measured`` (written by ``dllm-profile`` on the GPU host) or ``estimated``
(derived from published or spot-measured numbers; the file's ``notes`` say how).

Curves (all times in seconds):

* ``h2d``          pinned host-to-device copy of ``bytes`` on a copy stream (``copies_per_expert``: how many
                   copies the measured runtime makes of one expert, default 2);
* ``gpu_experts``  one grouped GPU expert-FFN call over ``experts`` experts with ``tokens_per_expert``
                   tokens each (2-D grid), issued with the GPU idle: the host's work (routing plan,
                   launches) plus the kernels;
* ``gpu_experts_device`` (optional) the kernels of that call alone (same grid); where absent, the
                   whole call is GPU time. The difference is host time, which overlaps with copies
                   that a call waits for;
* ``cpu_expert``   one expert FFN on the CPU for ``tokens`` tokens (``threads``: the engine's threads, which
                   the replay uses too; ``engine``: the CPU engine measured, ``torch`` (the default) or ``kt``;
                   ``ordering``, kt only: how its calls were ordered with the GPU, ``stream`` (the default: the
                   only ordering before it was recorded), ``host`` or ``direct``);
                   optional ``call_overhead_s``: the fixed cost of one CPU call over a layer's experts;
                   optional ``bands``: ``[{"after": k, "seconds": [...]}, ...]`` (``after`` ascending, >= 1; each
                   ``seconds`` on the ``tokens`` grid): what each expert of a call beyond its ``k`` with the most
                   tokens costs, up to the next band's ``after``. A parallel engine runs a large call's experts
                   side by side, so they cost less each than the first few; absent: every expert at ``seconds``;
                   optional ``mem_gbps``: the host memory bandwidth probed just before and just after the curve
                   was timed (GB/s; an expert's CPU cost follows it, and a shared host's moves);
                   optional ``probe_s``: the engine's probe call (``profiler.host_probe.CPU_PROBE_CALL``) timed just
                   before and just after the curve (seconds), which each validation replay times again;
                   optional ``settle_s``: the same call's medians in the rounds before, until two agreed (a fresh
                   engine's first calls run slower; the curve is timed once it settled);
* ``cpu_dispatch`` fixed cost of sending a layer's activations to the CPU and its results back;
* ``non_expert``   attention + norms + gate + shared expert of one MoE layer vs (tokens, kv_len);
* ``dense_layer``  a dense (non-MoE) decoder layer vs (tokens, kv_len);
* ``per_forward``  embedding, final norm, lm-head and sampling vs tokens.

Optional ``runtime``: the runtime's terms, costs of the running runtime the curves do not hold (host work around a
layer's calls, slowdowns where operations share host memory, the policy-time factor), each a field of
:data:`~dllm_offload_sim.costmodel.runtime_terms.RUNTIME_TERMS` with its unit, what it is charged per and its default.
"""

from __future__ import annotations

import copy
import difflib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dllm_offload_sim.costmodel.runtime_terms import RUNTIME_TERMS
from dllm_offload_sim.traces.atomic import atomic_write_json

PROFILE_SCHEMA_VERSION = 1
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
STATUSES = ("measured", "estimated")
# copies the runtime makes per expert; a profile that does not say (``h2d.copies_per_expert``) was measured on a
# runtime that copied an expert's gate/up and down projections separately
DEFAULT_COPIES_PER_EXPERT = 2
CPU_ENGINES = ("torch", "kt")  # runtime.cpu_engine: the PyTorch reference, kt-kernel
CPU_ORDERINGS = (
    "host",
    "stream",
    "direct",
)  # runtime.cpu_engine.ORDERINGS: how kt-kernel's calls are ordered
# the host only enqueues; what a profile without ``cpu_expert.ordering`` measured
DEFAULT_CPU_ORDERING = "stream"
CURVES_1D = {"cpu_expert": "tokens", "cpu_dispatch": "tokens", "per_forward": "tokens"}
CURVES_2D = {
    "gpu_experts": ("experts", "tokens_per_expert"),
    "non_expert": ("tokens", "kv_len"),
    "dense_layer": ("tokens", "kv_len"),
}
OPTIONAL_2D = {"gpu_experts_device": ("experts", "tokens_per_expert")}
STAMP_FIELDS = ("gpu", "driver", "cuda", "torch", "cpu_model", "cpu_threads", "dtype")
SHAPE_FIELDS = ("name", "hidden", "moe_intermediate", "expert_bytes")
RUNTIME_FIELDS = tuple(t.name for t in RUNTIME_TERMS)
RUNTIME_RATIOS = tuple(t.name for t in RUNTIME_TERMS if t.unit == "ratio")  # not seconds


def curve_axes(name: str) -> tuple:
    """The axis names of a profile curve, in the order of its ``seconds`` dimensions (``h2d``: bytes)."""
    if name == "h2d":
        return ("bytes",)
    ax = {**CURVES_1D, **CURVES_2D, **OPTIONAL_2D}[name]
    return (ax,) if isinstance(ax, str) else tuple(ax)


class ProfileError(ValueError):
    """A profile file that cannot be used: names the file and the field."""

    def __init__(self, file, field: str, message: str):
        self.file, self.field = str(file), field
        super().__init__(f"{file}, field '{field}': {message}")


@dataclass
class HardwareProfile:
    """The parsed content of a profile file (see module docstring for the curves)."""

    name: str
    status: str
    stamp: dict
    model_shape: dict
    h2d: dict
    curves: dict  # curve name -> dict with axes and "seconds"
    policy_per_layer_s: float = 0.0
    notes: str = ""
    runtime: dict | None = None  # optional per-layer host overheads (module docstring)
    path: str = ""
    # how a measured profile was timed: the profiler's parameters by name (repeats, passes, engine, threads, the
    # CPU calls' sizes, ...); docs/cost-model.md, "How the profiler times each curve", says what each means
    method: dict | None = None

    def to_dict(self) -> dict:
        return {
            "schema_version": PROFILE_SCHEMA_VERSION,
            "name": self.name,
            "status": self.status,
            "stamp": self.stamp,
            "model_shape": self.model_shape,
            "h2d": self.h2d,
            **self.curves,
            "policy_per_layer_s": self.policy_per_layer_s,
            "notes": self.notes,
            **({"runtime": self.runtime} if self.runtime else {}),
            **({"method": self.method} if self.method else {}),
        }

    def save(self, path) -> Path:
        validate_profile_dict(self.to_dict(), path)
        return atomic_write_json(path, self.to_dict())

    def memory_probes_gbps(self) -> list[float]:
        """The host memory bandwidths (GB/s) probed while this profile was measured, in time order: the host probe
        before, the probes around the CPU expert curve, the host probe after (those it has)."""
        probe = (self.stamp or {}).get("host_probe") or {}
        seen = lambda k: (
            [float(probe[k]["mem_gbps"])] if isinstance(probe.get(k), dict) and "mem_gbps" in probe[k] else []
        )  # noqa: E731
        curve = [float(v) for v in (self.curves.get("cpu_expert") or {}).get("mem_gbps") or ()]
        return seen("before") + curve + seen("after")

    def _positive(self, field: str, v) -> float:
        """``v`` as a float, or :class:`ProfileError` naming this profile and ``field`` where it is not a number > 0."""
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
            raise ProfileError(self.path or self.name, field, f"must be a number > 0, got {v!r}")
        return float(v)

    def _scale_cpu_experts(self, f: float) -> dict:
        """Scale this profile's per-expert CPU costs (``cpu_expert.seconds`` and its bands) by ``f`` in place; returns
        the ``cpu_expert`` curve. For the copies :meth:`_derived` makes."""
        c = self.curves["cpu_expert"]
        c["seconds"] = [float(v) * f for v in c["seconds"]]
        for b in c.get("bands") or ():
            b["seconds"] = [float(v) * f for v in b["seconds"]]
        return c

    def _derived(self, note: str) -> "HardwareProfile":
        """A deep copy, not backed by a file, with ``note`` added to its notes (what changed, and why)."""
        out = copy.deepcopy(self)
        out.notes = (self.notes + " " if self.notes else "") + note
        out.path = ""
        return out

    def at_memory_bandwidth(self, gbps: float) -> "HardwareProfile":
        """A copy whose CPU expert costs (``cpu_expert.seconds`` and its bands) are those of a host streaming memory at
        ``gbps`` instead of the bandwidth the curve was timed at (:meth:`cpu_curve_gbps`): each scaled by their ratio,
        since an expert on the CPU streams its weights. The call's fixed cost and the activations' round trip stay.
        Raises :class:`ProfileError` where the profile has no bandwidth or ``gbps`` is not a positive number."""
        at = self.cpu_curve_gbps()
        if at is None:
            raise ProfileError(
                self.path or self.name,
                "cpu_expert.mem_gbps",
                "absent, and no host probe: the bandwidth the CPU curve was timed at is unknown",
            )
        gbps = self._positive("host_mem_gbps", gbps)
        f = at / gbps
        out = self._derived(
            f"CPU expert costs scaled by {f:.4f}: from {at:.2f} GB/s, the bandwidth the curve was "
            f"timed at, to {gbps:.2f}."
        )
        c = out._scale_cpu_experts(f)
        c["mem_gbps"] = [gbps]
        return out

    # the runtime terms that are the replay's own host work, which a host whose single thread runs faster or slower
    # does faster or slower
    HOST_TERMS = tuple(t.name for t in RUNTIME_TERMS if t.host_work)

    def at_host_launch(self, us: float) -> "HardwareProfile":
        """A copy whose runtime host terms (:attr:`HOST_TERMS`) are those of a host that launches a kernel in ``us``
        microseconds instead of the profile's ``stamp.host_launch_us``: each scaled by their ratio. Raises
        :class:`ProfileError` where the profile has no launch time or ``us`` is not a positive number."""
        at = (self.stamp or {}).get("host_launch_us")
        if not at:
            raise ProfileError(
                self.path or self.name,
                "stamp.host_launch_us",
                "absent: the host's launch time at the profile is unknown",
            )
        us = self._positive("host_launch_us", us)
        f = us / float(at)
        out = self._derived(
            f"Runtime host terms scaled by {f:.4f}: from a {float(at):.2f} us kernel launch to {us:.2f} us."
        )
        rt = out.runtime or {}
        for k in self.HOST_TERMS:
            if k in rt:
                rt[k] = float(rt[k]) * f
        out.stamp = {**out.stamp, "host_launch_us": us}
        return out

    def with_runtime_terms(self, terms: dict, why: str) -> "HardwareProfile":
        """A copy whose runtime terms named in ``terms`` (seconds, e.g. ``{"bookkeeping_s": 6e-5}``) are these values;
        ``why`` goes into the notes. Raises :class:`ProfileError` for a name that is not a runtime term or a value that
        is not a number >= 0."""
        for k, v in terms.items():
            if k not in RUNTIME_FIELDS or k in RUNTIME_RATIOS:
                raise ProfileError(self.path or self.name, f"runtime.{k}", "not a runtime term in seconds")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise ProfileError(
                    self.path or self.name, f"runtime.{k}", f"must be a number >= 0, got {v!r}"
                )
        listed = ", ".join(f"{k} {1e6 * float(v):.1f} us" for k, v in sorted(terms.items()))
        out = self._derived(f"Runtime terms set ({why}): {listed}.")
        out.runtime = {**(out.runtime or {}), **{k: float(v) for k, v in terms.items()}}
        return out

    def cpu_probe_s(self) -> float | None:
        """The engine probe's call time around the CPU expert curve (the median of ``cpu_expert.probe_s``); None in a
        profile without it."""
        probe = (self.curves.get("cpu_expert") or {}).get("probe_s")
        return float(np.median([float(v) for v in probe])) if probe else None

    def at_cpu_probe(self, seconds: float) -> "HardwareProfile":
        """A copy whose CPU expert costs are those of an engine whose probe call takes ``seconds`` instead of
        :meth:`cpu_probe_s` (:meth:`with_cpu_speed` by their ratio). Raises :class:`ProfileError` where the profile
        has no probe or ``seconds`` is not a positive number."""
        at = self.cpu_probe_s()
        if at is None:
            raise ProfileError(
                self.path or self.name,
                "cpu_expert.probe_s",
                "absent: the engine's speed at the CPU curve is unknown",
            )
        seconds = self._positive("cpu_probe_s", seconds)
        out = self.with_cpu_speed(
            seconds / at, f"from a {1e3 * at:.3f} ms engine probe call to {1e3 * seconds:.3f} ms"
        )
        out.curves["cpu_expert"]["probe_s"] = [seconds]
        return out

    def with_cpu_speed(self, factor: float, why: str = "") -> "HardwareProfile":
        """A copy whose CPU expert costs (``cpu_expert.seconds``, its bands and its call's fixed cost) are ``factor``
        times these: an engine that runs ``factor`` times slower. ``why`` goes into the notes. Raises
        :class:`ProfileError` where ``factor`` is not a positive number."""
        f = self._positive("cpu speed factor", factor)
        out = self._derived(f"CPU expert costs scaled by {f:.4f}{': ' + why if why else ''}.")
        c = out._scale_cpu_experts(f)
        if "call_overhead_s" in c:
            c["call_overhead_s"] = float(c["call_overhead_s"]) * f
        return out

    def cpu_curve_gbps(self) -> float | None:
        """The host memory bandwidth the CPU expert curve was timed at: the median of the probes around it, or, in a
        profile without them, of the host probes; None where it has none."""
        curve = (self.curves.get("cpu_expert") or {}).get("mem_gbps")
        seen = [float(v) for v in curve] if curve else self.memory_probes_gbps()
        return float(np.median(seen)) if seen else None


# plausibility: a profile in other units (ms, us, MiB) passes every structural check, so its numbers are held to
# what a real host can measure; each bound is far outside every measured and estimated profile
MAX_OP_SECONDS = 10.0  # no curve's one operation (a layer's part, a grouped call, a CPU expert) takes longer
H2D_GBPS_RANGE = (0.5, 5000.0)  # the H2D bandwidth the copy curve implies


def _numbers(file, value, field: str) -> np.ndarray:
    """``value`` as a float array, or :class:`ProfileError` naming ``field`` (a string or a ragged row in it)."""
    try:
        return np.asarray(value, float)
    except (TypeError, ValueError):
        raise ProfileError(
            file, field, f"must be numbers in a rectangular list, got {str(value)[:80]}"
        ) from None


def _axis(file, d: dict, key: str, where: str) -> np.ndarray:
    if not isinstance(d, dict):
        raise ProfileError(file, where, f"must be a mapping of axes and seconds, got {str(d)[:80]}")
    if key not in d:
        raise ProfileError(file, f"{where}.{key}", "missing")
    a = _numbers(file, d[key], f"{where}.{key}")
    if a.ndim != 1 or a.size < 1 or not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ProfileError(
            file, f"{where}.{key}", f"must be a non-empty list of finite numbers >= 0, got {d[key]!r}"
        )
    if a.size > 1 and np.any(np.diff(a) <= 0):
        raise ProfileError(file, f"{where}.{key}", "must be strictly increasing")
    return a


def _seconds(file, d: dict, where: str, shape) -> np.ndarray:
    if "seconds" not in d:
        raise ProfileError(file, f"{where}.seconds", "missing")
    s = _numbers(file, d["seconds"], f"{where}.seconds")
    if s.shape != tuple(shape):
        raise ProfileError(
            file, f"{where}.seconds", f"shape {s.shape} does not match its axes {tuple(shape)}"
        )
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        bad = np.argwhere(~np.isfinite(s) | (s < 0))[0].tolist()
        raise ProfileError(file, f"{where}.seconds", f"entry {bad} is negative or not finite")
    if s.size and s.max() > MAX_OP_SECONDS:
        bad = np.unravel_index(int(np.argmax(s)), s.shape)
        raise ProfileError(
            file,
            f"{where}.seconds",
            f"entry {[int(i) for i in bad]} is {s.max():g} s, more than any "
            f"one operation takes ({MAX_OP_SECONDS:g} s): are the times in ms or us? A profile holds "
            f"seconds",
        )
    return s


def _check_cpu_bands(file, cpu: dict) -> None:
    """``cpu_expert.bands``: a list of ``{"after": int >= 1, "seconds": [...]}``, ``after`` strictly ascending, each
    ``seconds`` finite, >= 0 and on the curve's ``tokens`` grid."""
    bands = cpu.get("bands")
    if bands is None:
        return
    if not isinstance(bands, list) or not bands:
        raise ProfileError(file, "cpu_expert.bands", f"must be a non-empty list (or absent), got {bands!r}")
    n, last = len(cpu["tokens"]), 0
    for i, b in enumerate(bands):
        where = f"cpu_expert.bands[{i}]"
        if not isinstance(b, dict) or set(b) != {"after", "seconds"}:
            raise ProfileError(file, where, f"must be a mapping with 'after' and 'seconds', got {b!r}")
        k = b["after"]
        if isinstance(k, bool) or not isinstance(k, int) or k <= last:
            raise ProfileError(file, f"{where}.after", f"must be an integer > {last} (ascending), got {k!r}")
        last = k
        try:
            v = np.asarray(b["seconds"], float)
        except (TypeError, ValueError):
            raise ProfileError(file, f"{where}.seconds", f"must be numbers, got {b['seconds']!r}") from None
        if v.shape != (n,) or not np.isfinite(v).all() or (v < 0).any():
            raise ProfileError(
                file,
                f"{where}.seconds",
                f"must be {n} finite numbers >= 0 (one per token count), got {b['seconds']!r}",
            )


def validate_profile_dict(d: dict, file="<profile>") -> None:
    """Check a profile's structure and that its numbers are plausible seconds and bytes; raises
    :class:`ProfileError` naming the file and field."""
    if not isinstance(d, dict):
        raise ProfileError(
            file, "<top level>", f"must be a JSON object (a profile), got a {type(d).__name__}"
        )
    known = {
        "schema_version",
        "name",
        "status",
        "stamp",
        "model_shape",
        "h2d",
        "policy_per_layer_s",
        "notes",
        "runtime",
        "method",
        *CURVES_1D,
        *CURVES_2D,
        *OPTIONAL_2D,
    }
    for k in d:
        if k not in known:  # a misspelt optional field would be ignored and change the results
            near = difflib.get_close_matches(str(k), sorted(known), n=1)
            raise ProfileError(
                file,
                str(k),
                "unknown field"
                + (f"; did you mean {near[0]!r}?" if near else f"; expected one of {sorted(known)}"),
            )
    if d.get("schema_version") != PROFILE_SCHEMA_VERSION:
        raise ProfileError(
            file, "schema_version", f"is {d.get('schema_version')!r}; expected {PROFILE_SCHEMA_VERSION}"
        )
    if d.get("status") not in STATUSES:
        raise ProfileError(file, "status", f"is {d.get('status')!r}; expected one of {STATUSES}")
    for f in STAMP_FIELDS:
        if f not in d.get("stamp", {}):
            raise ProfileError(file, f"stamp.{f}", "missing")
    hl = d.get("stamp", {}).get("host_launch_us")
    if hl is not None and (
        isinstance(hl, bool) or not isinstance(hl, (int, float)) or not np.isfinite(hl) or hl <= 0
    ):
        raise ProfileError(file, "stamp.host_launch_us", f"must be a number > 0 (or absent), got {hl!r}")
    for f in SHAPE_FIELDS:
        if f not in d.get("model_shape", {}):
            raise ProfileError(file, f"model_shape.{f}", "missing")
    h = d.get("h2d")
    if not isinstance(h, dict):
        raise ProfileError(file, "h2d", "missing")
    b = _axis(file, h, "bytes", "h2d")
    _seconds(file, h, "h2d", b.shape)
    if b.size < 2:
        raise ProfileError(file, "h2d.bytes", "needs at least two sizes to fit latency and bandwidth")
    eb = d["model_shape"].get("expert_bytes")
    if isinstance(eb, (int, float)) and not isinstance(eb, bool) and eb > 0 and b[-1] < eb / 2:
        raise ProfileError(
            file,
            "h2d.bytes",
            f"the largest copy is {b[-1]:g} bytes, under half an expert "
            f"(model_shape.expert_bytes {eb:g}): are they in bytes (not MiB)?",
        )
    hs = np.asarray(h["seconds"], float)
    # the bandwidth between the smallest and largest copy
    gbps = (b[-1] - b[0]) / max(hs[-1] - hs[0], 1e-15) / 1e9
    lo, hi = H2D_GBPS_RANGE
    if (
        b[-1] >= 1 << 20 and not lo <= gbps <= hi
    ):  # copies of real sizes (a test's toy experts may copy slowly)
        raise ProfileError(
            file,
            "h2d",
            f"the copies imply {gbps:.3g} GB/s, outside any host's {lo:g}-{hi:g} GB/s: are "
            f"h2d.bytes in bytes (not MiB) and h2d.seconds in seconds (not ms or us)?",
        )
    cpe = h.get("copies_per_expert", DEFAULT_COPIES_PER_EXPERT)
    if isinstance(cpe, bool) or not isinstance(cpe, int) or cpe < 1:
        raise ProfileError(file, "h2d.copies_per_expert", f"must be an integer >= 1 (or absent), got {cpe!r}")
    for name, ax in CURVES_1D.items():
        if name not in d:
            raise ProfileError(file, name, "missing curve")
        _seconds(file, d[name], name, _axis(file, d[name], ax, name).shape)
    for name, (a0, a1) in (*CURVES_2D.items(), *OPTIONAL_2D.items()):
        if name not in d:
            if name in OPTIONAL_2D:
                continue
            raise ProfileError(file, name, "missing curve")
        s0 = _axis(file, d[name], a0, name).shape[0]
        s1 = _axis(file, d[name], a1, name).shape[0]
        _seconds(file, d[name], name, (s0, s1))
    ovh = d["cpu_expert"].get("call_overhead_s", 0.0)
    if not isinstance(ovh, (int, float)) or not np.isfinite(ovh) or ovh < 0:
        raise ProfileError(file, "cpu_expert.call_overhead_s", f"must be a number >= 0, got {ovh!r}")
    th = d["cpu_expert"].get("threads")
    if th is not None and (isinstance(th, bool) or not isinstance(th, int) or th < 1):
        raise ProfileError(file, "cpu_expert.threads", f"must be an integer >= 1 (or absent), got {th!r}")
    eng = d["cpu_expert"].get("engine", "torch")
    if eng not in CPU_ENGINES:
        raise ProfileError(file, "cpu_expert.engine", f"must be one of {', '.join(CPU_ENGINES)}, got {eng!r}")
    order = d["cpu_expert"].get("ordering", DEFAULT_CPU_ORDERING)
    if order not in CPU_ORDERINGS:
        raise ProfileError(
            file, "cpu_expert.ordering", f"must be one of {', '.join(CPU_ORDERINGS)}, got {order!r}"
        )
    _check_cpu_bands(file, d["cpu_expert"])
    for field in ("mem_gbps", "probe_s", "settle_s"):
        v = d["cpu_expert"].get(field)
        if v is not None and (
            not isinstance(v, list)
            or not v
            or any(
                isinstance(x, bool) or not isinstance(x, (int, float)) or not np.isfinite(x) or x <= 0
                for x in v
            )
        ):
            raise ProfileError(
                file, f"cpu_expert.{field}", f"must be a non-empty list of numbers > 0 (or absent), got {v!r}"
            )
    if not isinstance(d.get("method", {}), dict):
        raise ProfileError(
            file, "method", f"must be a mapping of the profiler's parameters, got {d['method']!r}"
        )
    rt = d.get("runtime", {})
    if not isinstance(rt, dict):
        raise ProfileError(file, "runtime", f"must be a mapping of per-layer seconds, got {rt!r}")
    for k, v in rt.items():
        if k not in RUNTIME_FIELDS:
            raise ProfileError(file, f"runtime.{k}", f"unknown field; expected one of {RUNTIME_FIELDS}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            what = "a ratio" if k in RUNTIME_RATIOS else "a number of seconds"
            raise ProfileError(file, f"runtime.{k}", f"must be {what} >= 0, got {v!r}")
    pol = d.get("policy_per_layer_s", 0.0)
    if isinstance(pol, bool) or not isinstance(pol, (int, float)) or not np.isfinite(pol) or pol < 0:
        raise ProfileError(file, "policy_per_layer_s", f"must be a finite number >= 0, got {pol!r}")


def load_profile(path_or_name) -> HardwareProfile:
    """Load and validate a profile file, by path or by the name of a shipped profile."""
    p = Path(path_or_name)
    if not p.suffix:
        p = resolve_shipped(str(path_or_name))
    if not p.is_file():
        raise ProfileError(p, "<file>", "no such profile file")
    try:
        d = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ProfileError(p, "<file>", f"not valid JSON ({e})") from None
    validate_profile_dict(d, p)
    curves = {k: d[k] for k in (*CURVES_1D, *CURVES_2D, *OPTIONAL_2D) if k in d}
    return HardwareProfile(
        name=d.get("name", p.stem),
        status=d["status"],
        stamp=d["stamp"],
        model_shape=d["model_shape"],
        h2d=d["h2d"],
        curves=curves,
        policy_per_layer_s=float(d.get("policy_per_layer_s", 0.0)),
        notes=d.get("notes", ""),
        path=str(p),
        runtime=d.get("runtime"),
        method=d.get("method"),
    )


def shipped_profiles() -> list[Path]:
    return sorted(PROFILE_DIR.glob("*.json"))


def resolve_shipped(name: str) -> Path:
    """``h200-mini`` -> the measured file if one is shipped, else the estimated one."""
    for status in ("measured", "estimated"):
        p = PROFILE_DIR / f"{name}.{status}.json"
        if p.is_file():
            return p
    p = PROFILE_DIR / f"{name}.json"
    if p.is_file():
        return p
    known = sorted({f.name.split(".")[0] for f in shipped_profiles()})
    raise ProfileError(
        PROFILE_DIR / f"{name}.*.json", "<file>", f"no shipped profile named {name!r}; known: {known}"
    )
