"""Plots for the placement benchmarks (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # the Agg backend is chosen before pyplot loads

Curve = Sequence[float | None]


def _xy(curve: Curve) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for x, y in enumerate(curve):
        if y is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def allocation_curves(
    path: Path,
    ours: Mapping[str, Curve],
    published: Mapping[str, Curve],
    *,
    title: str,
    counterparts: Mapping[str, str] | None = None,
) -> None:
    """Allocation % against arrived %, roost's runs solid and the FGD artifact's
    published means dashed, each in the colour of its roost counterpart (grey when it
    has none); the right panel zooms on the loaded end."""
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(13, 5.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    mine = {name: colors[k % len(colors)] for k, name in enumerate(ours)}
    twin = {theirs: mine[m] for m, theirs in (counterparts or {}).items() if m in mine}
    greys = iter(["0.35", "0.55", "0.7", "0.8"] * 4)
    theirs_color = {name: twin.get(name) or next(greys) for name in published}
    for ax in (full, zoom):
        for name, curve in ours.items():
            xs, ys = _xy(curve)
            ax.plot(xs, ys, color=mine[name], lw=1.8, label=name)
        for name, curve in published.items():
            xs, ys = _xy(curve)
            ax.plot(xs, ys, color=theirs_color[name], lw=1.2, ls="--",
                    label=f"{name} (published)")
        ax.axvline(100, color="0.6", lw=0.8, ls=":")
        ax.set_xlabel("arrived GPU demand, % of cluster GPU capacity")
        ax.grid(alpha=0.3)
    full.plot([0, 100], [0, 100], color="0.8", lw=0.8)
    full.set_ylabel("allocated GPU, % of capacity")
    full.set_xlim(0, 130)
    full.set_ylim(0, 100)
    zoom.set_xlim(75, 130)
    zoom.set_ylim(75, 100)
    zoom.set_title("zoom: the loaded end")
    full.set_title(title)
    zoom.legend(loc="lower right", fontsize=7.5, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def host_bars(path: Path, min_hosts: Mapping[str, int], *, lower_bound: int, title: str) -> None:
    """Fewest hosts with zero rejections per policy, against the demand lower bound."""
    names = list(min_hosts)
    fig, ax = plt.subplots(figsize=(7.5, 4))
    bars = ax.bar(names, [min_hosts[n] for n in names], color="#4c72b0")
    ax.axhline(lower_bound, color="#c44e52", ls="--", lw=1.2,
               label=f"lower bound (peak demand / host): {lower_bound}")
    for b, n in zip(bars, names, strict=True):
        ax.annotate(str(min_hosts[n]), (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=9)
    lo = min(min(min_hosts.values()), lower_bound)
    hi = max(min_hosts.values())
    ax.set_ylim(lo * 0.97, hi * 1.1)
    ax.set_ylabel("hosts for zero rejections")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
