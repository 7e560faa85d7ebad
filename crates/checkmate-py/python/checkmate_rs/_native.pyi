"""Type stubs of the native module (crates/checkmate-py/src/lib.rs)."""

from os import PathLike
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

__version__: str

Step = Tuple[str, int]
Budget = Union[int, str]

class CheckmateError(Exception):
    """A malformed graph or plan, a budget no plan fits, a solver failure."""

class Graph:
    """A training graph: nodes in topological order, static memory held throughout a step."""

    def __init__(
        self,
        costs: Sequence[float],
        bytes: Sequence[int],
        deps: Sequence[Sequence[int]],
        *,
        names: Optional[Sequence[str]] = None,
        kinds: Optional[Sequence[str]] = None,
        workspace: Optional[Sequence[int]] = None,
        static_bytes: int = 0,
        name: str = "graph",
        cost_unit: str = "flops",
    ) -> None: ...
    @staticmethod
    def from_json(text: str, context: str = "<string>") -> "Graph":
        """checkmate-graph/1 or networkx node-link JSON."""
    @staticmethod
    def read(path: Union[str, PathLike]) -> "Graph": ...
    def to_json(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def cost_unit(self) -> str: ...
    @property
    def static_bytes(self) -> int: ...
    @property
    def total_cost(self) -> float: ...
    @property
    def checkpoint_all_peak(self) -> int: ...
    @property
    def min_feasible_activation_bytes(self) -> int: ...
    @property
    def names(self) -> List[str]: ...
    @property
    def deps(self) -> List[List[int]]: ...
    def __len__(self) -> int: ...

def solve(
    graph: Graph,
    budget: Budget,
    strategy: str = "milp",
    *,
    time_limit: Optional[float] = None,
    threads: int = 1,
    mip_gap: float = 1e-4,
    seed: int = 0,
    warm_start: bool = True,
) -> Dict[str, Any]:
    """Keys: strategy, status, cost, lower_bound, peak_bytes, total_peak_bytes, overhead,
    computes, plan (list of ("compute"|"free", node)), plan_json, solve_seconds, budget_bytes,
    activation_budget_bytes, limit, exact_model (whether HiGHS solved the exact MILP)."""

def simulate(graph: Graph, plan: Union[Sequence[Step], str]) -> Dict[str, Any]:
    """Keys: cost, peak_bytes, total_peak_bytes, peak_step, computes, overhead, live_after_step."""

def sweep(
    graph: Graph,
    strategies: Optional[Sequence[str]] = None,
    points: int = 5,
    *,
    time_limit: Optional[float] = None,
    threads: int = 1,
    mip_gap: float = 1e-4,
    seed: int = 0,
) -> List[Dict[str, Any]]: ...

def strategies() -> List[str]: ...

def knapsack(
    values: Sequence[float],
    weights: Sequence[float],
    capacity: float,
    *,
    time_limit: Optional[float] = None,
) -> Dict[str, Any]:
    """Exact 0/1 knapsack (HiGHS). Keys: chosen (item indices), value, weight, optimal."""
