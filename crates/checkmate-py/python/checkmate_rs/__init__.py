"""checkmate_rs: optimal tensor rematerialization from Rust (checkmate-rs), for Python.

Graphs (``Graph``), every strategy of ``checkmate solve`` (``solve``, ``strategies()``), the
simulator (``simulate``) and frontiers (``sweep``). Errors of the Rust crates are raised as
``CheckmateError`` with their messages; bad arguments as ``ValueError``. Solves release the GIL.

    >>> import checkmate_rs as cm
    >>> g = cm.Graph(costs=[1, 1, 1], bytes=[4, 4, 4], deps=[[], [0], [1]])
    >>> cm.solve(g, "100%", "milp")["status"]
    'optimal'
"""

from ._native import (  # noqa: F401
    CheckmateError,
    Graph,
    __version__,
    knapsack,
    simulate,
    solve,
    strategies,
    sweep,
)

__all__ = ["CheckmateError", "Graph", "simulate", "solve", "strategies", "sweep", "__version__", "knapsack"]
