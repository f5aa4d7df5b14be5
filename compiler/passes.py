"""The graph passes between reading a model and building it, in their one order.

A loaded :class:`~tunecache.compiler.graph.Graph` runs through layout planning
(:func:`tunecache.compiler.layout_plan.plan_layouts`: which activations stay channel-blocked
between kernels, with the reorders that needs), then kernel-pair fusion
(:func:`tunecache.compiler.fusion.fuse_pairs`, which must see the planned layouts: a fused
kind decides from the ops as they will run; at a lower precision, the policy's veto keeps a
product it lowers out of a fused float32 op, :func:`tunecache.compiler.precision.lowered_apart`).
:func:`plan_graph` is that sequence; compiling a model and listing the ops it runs both call
it, so what is tuned is what runs.
"""

from __future__ import annotations

from tunecache.compiler.fusion import fuse_pairs
from tunecache.compiler.graph import Graph
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.layout_plan import plan_layouts
from tunecache.compiler.precision import lowered_apart

__all__ = ["plan_graph"]


def plan_graph(graph: Graph, hw: HardwareSpec, *, blocked_layouts: bool = True,
               precision: str = "fp32") -> Graph:
    """``graph`` as compiled for ``hw`` at ``precision``: its activations' layouts planned
    (unless ``blocked_layouts`` is off: every tensor then stays plain ``nchw``), then every
    fusable pair of kernel nodes fused that the precision policy does not keep apart."""
    if blocked_layouts:
        graph = plan_layouts(graph, hw).graph
    graph, _ = fuse_pairs(graph, lowered_apart(graph, hw, precision))
    return graph
