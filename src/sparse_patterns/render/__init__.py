"""Figures: the connectivity matrix, the image view, hop distances, schedules and scaling.

Every ``plot_*`` function takes ``ax=None`` (a new figure when None), imports
matplotlib inside, draws, and returns the Axes; none of them saves or prints.
Saving is :func:`save_figure` (atomic: a temporary file in the same directory,
then a rename), and :func:`build_gallery` regenerates the ``figures/`` gallery.
Colours come from the colour-blind-safe Okabe-Ito palette: head ``k`` has
colour ``HEAD_COLORS[k]``, a cell several heads attend the mean of theirs.
"""

from __future__ import annotations

from ._save import FORMATS, check_output, save_figure
from ._style import (
    BACKGROUND,
    HEAD_COLORS,
    OKABE_ITO,
    QUERY_COLOR,
    combo_color,
    head_color,
    new_axes,
    pattern_title,
)
from .analysis import HOP_LIMIT, hop_color, plot_hops, plot_scaling
from .figure import VIEWS, render_view
from .gallery import build_gallery, paper_figure
from .image import check_raster, plot_image_view
from .matrix import TOKEN_LIMIT, auto_block, block_density, plot_pattern
from .profile import plot_profile
from .schedule import SCHEDULE_LIMIT, plot_schedule, schedule_figure, schedule_hops

__all__ = [
    "plot_pattern", "plot_profile", "check_output", "plot_image_view", "plot_hops", "plot_scaling", "paper_figure",
    "build_gallery", "hop_color", "HOP_LIMIT", "block_density", "auto_block", "check_raster",
    "pattern_title", "head_color", "combo_color", "HEAD_COLORS", "OKABE_ITO", "BACKGROUND",
    "QUERY_COLOR", "TOKEN_LIMIT", "save_figure", "FORMATS", "render_view", "VIEWS",
    "plot_schedule", "schedule_hops", "schedule_figure", "SCHEDULE_LIMIT", "new_axes",
]
