"""``--plot``: TPOT against KV depth, ours and llama.cpp, one panel per model (matplotlib,
from the optional ``perf`` extra: ``pip install 'llcinfer[perf]'``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from .report import OURS, Record


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'llcinfer[perf]'") from None


def plot_tpot(records: list[Record], path: str | Path, title: str = "") -> None:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tg = [r for r in records if r.kind == "tg" and r.tpot_ms is not None]
    models = list(dict.fromkeys(r.model for r in tg))
    if not models:
        raise UsageError("--plot: no successful tg results to plot")
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in tg if r.model == model]
        series: dict[str, list[Record]] = {}
        for r in mine:
            label = "llcinfer" if r.engine == OURS else f"llama.cpp ({r.build})"
            series.setdefault(f"{label}, {r.threads} t", []).append(r)
        for label, recs in series.items():
            recs.sort(key=lambda r: r.depth)
            style = "-o" if label.startswith("llcinfer") else "--s"
            ax.errorbar([r.depth for r in recs], [r.tpot_ms for r in recs],
                        yerr=[1000.0 * r.tps_std / r.tps_mean ** 2 for r in recs], fmt=style, capsize=3, label=label)
        ax.set_title(model)
        ax.set_xlabel("KV depth (tokens)")
        ax.set_ylabel("TPOT (ms)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
