# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Paper figures, interactively
#
# Loads the sweep tables written by `python notebooks/figures.py` (default `figures/_work/sweeps/`)
# and redraws the figures with the same plotting functions. Open with Jupyter + jupytext, or run
# as a script. Run `python notebooks/figures.py` (or `--quick`) first.

# %%
import sys
from pathlib import Path


def _repo_root() -> Path:
    """The checkout this notebook belongs to, from wherever it runs (its own folder, the root, elsewhere)."""
    here = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
    for p in (here, *here.parents):
        if (p / "notebooks" / "figures.py").is_file():
            return p
    raise FileNotFoundError("run this notebook inside a dllm-offload-sim checkout")


ROOT = _repo_root()
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "notebooks"))

import pandas as pd  # noqa: E402

import figures as F  # noqa: E402
from dllm_offload_sim.sim.collect import collect  # noqa: E402

SWEEPS = ROOT / "figures" / "_work" / "sweeps"
tables = {exp: collect(SWEEPS / exp).table for exp in F.EXPERIMENTS if (SWEEPS / exp).is_dir()}
{k: len(v) for k, v in tables.items()}

# %% [markdown]
# ## Fig. 12: TPOT and cache utilisation of every system

# %%
t12 = tables["fig12"]
t12.pivot_table(index="policy", columns=["model", "cache"], values="tpot_ms").round(2)

# %%
t12.pivot_table(index="policy", columns=["model", "cache"], values="cache_util").round(3)

# %% [markdown]
# ## Fig. 13: gap to the retention bound (belady)

# %%
g = tables["fig13"].pivot_table(index="cache", columns="policy", values="tpot_ms")
(100 * (g.oled / g.belady - 1)).rename("OLED above belady (%)")

# %% [markdown]
# ## Redraw every figure into a scratch folder

# %%
out = ROOT / "figures" / "_notebook"
out.mkdir(parents=True, exist_ok=True)
w = F.FigureWriter(out)
F.fig5_12(w, t12)
F.fig13(w, tables["fig13"])
F.fig15(w, t12, tables["fig15b"], tables["fig15c"])
F.fig16(w, tables["fig16a"], tables["fig16b"])
F.fig17(w, tables["fig17a"], tables["fig17b"], t12)
F.fig18(w, t12)
pd.DataFrame(w.entries, columns=["file", "shows", "note"])

# %% [markdown]
# ## The redrawn figures, inline

# %%
from IPython.display import Image, display  # noqa: E402

for name, *_ in w.entries:
    display(Image(filename=str(out / f"{name}.png")))
