"""Plots for the reports, drawn by matplotlib and embedded as ``data:`` PNG URIs.

Headless (the Agg backend, no display); every figure is closed after saving so a
long-running code server does not accumulate them. matplotlib is imported on first
use, not when the code location loads. A plot of nothing returns ``None`` and the
template says there is nothing to draw.
"""

from __future__ import annotations

import base64
import io
from functools import lru_cache


@lru_cache(maxsize=1)
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # before pyplot: never try to open a window
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 8, "axes.titlesize": 9, "figure.dpi": 100})
    return plt


def _data_uri(fig) -> str:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def damage_heatmap(partitions: list[str], labels: list[str], counts: dict[tuple[str, str], int]) -> str | None:
    """Partitions (rows, in order) x damage labels (columns): damaged keys, log colour scale."""
    if not partitions or not labels or not counts:
        return None
    plt = _pyplot()
    from matplotlib.colors import LogNorm

    grid = [[counts.get((p, label), 0) for label in labels] for p in partitions]
    masked = [[v if v else float("nan") for v in row] for row in grid]
    height = min(max(2.5, 0.06 * len(partitions) + 1.5), 16)
    fig, ax = plt.subplots(figsize=(1.0 + 0.75 * len(labels), height))
    image = ax.imshow(
        masked,
        aspect="auto",
        interpolation="nearest",
        cmap="magma_r",
        norm=LogNorm(vmin=1, vmax=max(max(row) for row in grid)),
    )
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    step = max(1, len(partitions) // 40)
    ax.set_yticks(range(0, len(partitions), step), partitions[::step])
    ax.set_title("damaged keys per partition and label")
    fig.colorbar(image, ax=ax, label="keys (log scale)", shrink=0.6)
    return _data_uri(fig)


def impact_bars(consumers: list[dict]) -> str | None:
    """Per consumer: material vs non-material differing rows (stacked bars), material count labelled."""
    if not consumers or not any(c["rows_differing"] for c in consumers):
        return None
    plt = _pyplot()
    names = [c["consumer"] for c in consumers]
    material = [c["material_rows"] for c in consumers]
    minor = [c["rows_differing"] - c["material_rows"] for c in consumers]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(names) + 1.2))
    ax.barh(names, material, color="#c0392b", label="material (at or above the threshold)")
    ax.barh(names, minor, left=material, color="#f0b27a", label="below materiality")
    for y, (m, c) in enumerate(zip(material, consumers)):
        ax.text(c["rows_differing"], y, f"  {m:,} material / {c['rows_differing']:,}", va="center", fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("consumer rows that differ from the same SQL over the expected rows")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=7, frameon=False)
    ax.set_title("consumer impact and materiality")
    return _data_uri(fig)


def totals_before_after(partitions: list[str], series: dict[str, list[float | None]]) -> str | None:
    """Amount totals per partition: one line per series (before, expected, after)."""
    if not partitions or not any(v is not None for values in series.values() for v in values):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    styles = {"before": ("#c0392b", "-"), "expected": ("#2c3e50", "--"), "after": ("#27ae60", ":")}
    x = range(len(partitions))
    for name, values in series.items():
        color, ls = styles.get(name, (None, "-"))
        ax.plot(x, [float("nan") if v is None else v for v in values], ls, color=color, label=name, linewidth=1.2)
    step = max(1, len(partitions) // 12)
    ax.set_xticks(list(x)[::step], partitions[::step], rotation=45, ha="right")
    present = [v for values in series.values() for v in values if v is not None]
    if min(present) > 0 and max(present) / min(present) > 50:  # a damaged total can be orders of magnitude off
        ax.set_yscale("log")
    ax.set_ylabel("total per partition")
    ax.legend(fontsize=7)
    ax.set_title("totals per partition: damaged, expected and repaired")
    return _data_uri(fig)
