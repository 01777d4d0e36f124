"""PNG plots of an evaluation report (matplotlib, Agg backend: no display needed).

Per domain/split of the report (:mod:`cast_rl.eval.report`):

- ``passk_vs_k_<domain>_<split>.png``: pass^k against k, one line per configuration, with
  its 95% interval as error bars (``pass^k_ci``, when the report has it);
- ``passk_vs_budget_<domain>_<split>.png``: pass^k against the verification budget, one line
  per k with its interval as a shaded band (only when the report holds at least two budgets).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def group_keys(report: dict[str, Any]) -> list[str]:
    """Every domain/split of the report, in order of first appearance."""
    keys: dict[str, None] = {}
    for config in report["configurations"]:
        keys.update(dict.fromkeys(config["groups"]))
    return list(keys)


def write_plots(report: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write every plot of the module docstring under ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for key in group_keys(report):
        stem = key.replace("/", "_")
        paths.append(plot_passk_vs_k(report, key, out_dir / f"passk_vs_k_{stem}.png"))
        budgets = {c["verification_budget"] for c in report["configurations"] if key in c["groups"]}
        if len(budgets) > 1:
            paths.append(plot_passk_vs_budget(report, key, out_dir / f"passk_vs_budget_{stem}.png"))
    return paths


def plot_passk_vs_k(report: dict[str, Any], group: str, path: Path) -> Path:
    """pass^k against k for one domain/split, one line per configuration."""
    fig, ax = _figure()
    present = [c for c in report["configurations"] if group in c["groups"]]
    for i, config in enumerate(present):
        table = config["groups"][group]["pass^k"]
        dodge = (i - (len(present) - 1) / 2) * 0.04  # side by side, so the bars do not hide each other
        ks, values = [_k(name) + dodge for name in table], list(table.values())
        cis = config["groups"][group].get("pass^k_ci")
        if cis:
            yerr = [[v - cis[name][0] for name, v in table.items()], [cis[name][1] - v for name, v in table.items()]]
            ax.errorbar(ks, values, yerr=yerr, marker="o", capsize=3, label=config["label"])
        else:
            ax.plot(ks, values, marker="o", label=config["label"])
    ax.set_xlabel("k")
    ax.set_ylabel("pass^k")
    ax.set_title(f"pass^k against k ({group}; bars: 95% interval)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    return _save(fig, ax, path)


def plot_passk_vs_budget(report: dict[str, Any], group: str, path: Path) -> Path:
    """pass^k against the verification budget for one domain/split, one line per k."""
    configs = sorted(
        (c for c in report["configurations"] if group in c["groups"]), key=lambda c: c["verification_budget"]
    )
    fig, ax = _figure()
    budgets = [c["verification_budget"] for c in configs]
    for name in configs[0]["groups"][group]["pass^k"]:
        (line,) = ax.plot(budgets, [c["groups"][group]["pass^k"][name] for c in configs], marker="o",
                          label=f"k={_k(name)}")
        cis = [c["groups"][group].get("pass^k_ci", {}).get(name) for c in configs]
        if all(cis):
            ax.fill_between(budgets, [ci[0] for ci in cis], [ci[1] for ci in cis], color=line.get_color(), alpha=0.15)
    ax.set_xlabel("verification budget B (0: no critic)")
    ax.set_ylabel("pass^k")
    ax.set_title(f"pass^k against budget ({group}; bands: 95% interval)")
    ax.set_xticks(budgets)
    return _save(fig, ax, path)


def _k(name: str) -> int:
    return int(name.split("^", 1)[1])


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(6, 4), dpi=100)


def _save(fig: Any, ax: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    logger.debug("wrote %s", path)
    return path
