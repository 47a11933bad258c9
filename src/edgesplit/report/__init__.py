"""Rendering results for people: number formatting and rich tables."""

from edgesplit.report.format import human_bytes, human_count
from edgesplit.report.tables import cuts_table, layers_table, models_table, split_points_table

__all__ = ["cuts_table", "human_bytes", "human_count", "layers_table", "models_table",
           "split_points_table"]
