"""PNG figures, one module per domain: ``plan`` (link sweeps, cut breakdowns, assignments,
Pareto fronts), ``hardware`` (profiles), ``train`` (L2S and split training), ``nas``
(searches), ``adaptivenet`` (search efficiency, switching under load), ``llm`` (split
generation by placement method), ``serving`` (requests/s by Ray replicas). This package
re-exports them all, so ``from edgesplit.report.plots import plot_pareto`` keeps working."""

from edgesplit.report.plots._figure import DPI, short_layer_name
from edgesplit.report.plots.adaptivenet import plot_search_efficiency, plot_switching
from edgesplit.report.plots.hardware import plot_profile
from edgesplit.report.plots.llm import plot_llm_methods
from edgesplit.report.plots.nas import (
    plot_accuracy_latency,
    plot_search_front,
    plot_search_progress,
)
from edgesplit.report.plots.plan import (
    auto_distortion,
    plot_assignment,
    plot_cut_breakdown,
    plot_link_sweep,
    plot_pareto,
)
from edgesplit.report.plots.serving import plot_replica_scaling
from edgesplit.report.plots.train import plot_l2s, plot_l2s_curves, plot_train_split

__all__ = [
    "DPI",
    "auto_distortion",
    "plot_accuracy_latency",
    "plot_assignment",
    "plot_cut_breakdown",
    "plot_l2s",
    "plot_l2s_curves",
    "plot_link_sweep",
    "plot_llm_methods",
    "plot_pareto",
    "plot_profile",
    "plot_replica_scaling",
    "plot_search_efficiency",
    "plot_search_front",
    "plot_search_progress",
    "plot_switching",
    "plot_train_split",
    "short_layer_name",
]
