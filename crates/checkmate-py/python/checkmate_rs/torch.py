"""checkmate_rs.torch: our peak-memory solver applied to PyTorch training steps.

Three ways in, all over the same capture (torch's own AOTAutograd joint forward/backward graph,
sizes from its tensors' metadata, FLOP costs from ``torch.utils.flop_counter``):

- ``compile(fn, budget)``: ``torch.compile`` with a partition function (``Partitioner``) that
  solves the joint graph under a peak-memory budget and hands torch the saved set of the plan: the
  backward recomputes exactly the forward values the plan recomputes. Kernels run eagerly
  (``aot_eager``-like), so the memory the process uses follows the schedule.
- ``Partitioner(budget)``: the same partition function, for your own ``aot_autograd`` backend.
- ``KnapsackSolver()``: for ``torch._functorch.config.activation_memory_budget_solver``: the exact
  0/1 knapsack (HiGHS) in place of torch's quantized dynamic program; one line for existing
  ``activation_memory_budget`` users.

``measure_peak(step)`` reports the peak of memory allocated during a call above what was held
before it (torch's profiler memory events on the CPU, ``max_memory_allocated`` on CUDA).

Supported: static shapes, functional aten graphs as AOTAutograd produces them (views, tuples,
batch norm, in-graph losses). Not supported: dynamic shapes (compile with ``dynamic=False``, the
default here), graph breaks split the step into several joint graphs solved one by one (each gets
the same fractional budget), custom ops are costed by the bytes they move (no FLOP formula), random
ops (dropout) are always saved, never recomputed.

torch is imported by this module only; ``import checkmate_rs`` does not need it.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.fx as fx

from . import _native

__all__ = [
    "Capture",
    "KnapsackSolver",
    "Partitioner",
    "Policy",
    "Report",
    "capture",
    "compile",
    "flop_cost",
    "measure_peak",
    "policy",
]

Budget = Union[float, int, str]

#: Cost charged per tensor element read or written, in FLOPs: memory-bound operators (ReLU,
#: batch norm, additions) cost by the data they move, compute-bound ones by their FLOPs.
FLOPS_PER_ELEMENT = 10.0


def _tensor_elements(val: Any, in_bytes: bool = False) -> int:
    """Elements (or bytes) of the tensors in a node's value (a tensor or a tuple of them)."""
    if isinstance(val, torch.Tensor):
        return int(val.numel()) * (val.element_size() if in_bytes else 1)
    if isinstance(val, (tuple, list)):
        return sum(_tensor_elements(v, in_bytes) for v in val)
    return 0


def _tensor_bytes(val: Any) -> int:
    return _tensor_elements(val, in_bytes=True)


def _is_view(node: fx.Node) -> bool:
    """An operator whose output aliases its first input (view, t, expand, detach, ...)."""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _is_random(node: fx.Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def flop_cost(node: fx.Node) -> float:
    """The default cost of a joint-graph node: its FLOPs (``torch.utils.flop_counter``'s formulas,
    on the recorded shapes; nothing is run) plus ``FLOPS_PER_ELEMENT`` per element read or
    written. Views and ``getitem`` cost nothing."""
    if node.target is operator.getitem or _is_view(node):
        return 0.0
    from torch.utils._pytree import tree_map
    from torch.utils.flop_counter import flop_registry

    def val(a: Any) -> Any:
        return a.meta.get("val") if isinstance(a, fx.Node) else a

    args, kwargs = tree_map(val, (node.args, node.kwargs))
    out = node.meta.get("val")
    flops = 0
    packet = getattr(node.target, "overloadpacket", None)
    if packet in flop_registry:
        try:
            flops = int(flop_registry[packet](*args, **kwargs, out_val=out))
        except Exception:  # a formula that does not take these arguments: bytes only
            flops = 0
    moved = _tensor_elements(out) + sum(
        _tensor_elements(a.meta.get("val")) for a in node.all_input_nodes
    )
    return float(flops) + FLOPS_PER_ELEMENT * moved


@dataclasses.dataclass
class Capture:
    """A joint forward/backward graph as a checkmate graph.

    Node ``i`` of ``graph`` is ``nodes[i]`` of the joint graph (its ``call_function`` nodes in
    order), and the last node is a sink named ``output`` that reads every output of the step (the
    forward's outputs and the gradients), which keeps them live to the end as torch does.
    Placeholders (parameters, inputs, the loss's incoming gradient) are held outside the step and
    are not nodes. A view's consumers also read the view's base, so the base stays live while the
    view is used; a view itself has no bytes.
    """

    joint: fx.GraphModule
    graph: "_native.Graph"
    nodes: List[fx.Node]
    index: Dict[fx.Node, int]
    backward: List[bool]
    num_fwd_outputs: int
    #: Placeholders the step may mutate in place (see ``_mutated_inputs``).
    mutated: Set[fx.Node] = dataclasses.field(default_factory=set)


def _is_tangent(node: fx.Node) -> bool:
    """An incoming gradient of the joint graph (AOTAutograd names them ``tangents_*``)."""
    return node.op == "placeholder" and node.name.startswith("tangent")


def _root(node: fx.Node) -> fx.Node:
    while _is_view(node) and node.all_input_nodes:
        node = node.args[0] if isinstance(node.args[0], fx.Node) else node.all_input_nodes[0]
    return node


def _flatten(x: Any) -> List[fx.Node]:
    if isinstance(x, fx.Node):
        return [x]
    if isinstance(x, (tuple, list)):
        return [n for v in x for n in _flatten(v)]
    if isinstance(x, dict):
        return [n for v in x.values() for n in _flatten(v)]
    return []


def to_graph(
    joint: fx.GraphModule,
    num_fwd_outputs: int,
    cost: Optional[Callable[[fx.Node], float]] = None,
    name: str = "torch-joint",
) -> Capture:
    """Maps an AOTAutograd joint graph to a checkmate graph (see ``Capture``)."""
    cost = cost or flop_cost
    nodes = [n for n in joint.graph.nodes if n.op == "call_function"]
    index = {n: i for i, n in enumerate(nodes)}
    backward: List[bool] = []
    is_bw: Dict[fx.Node, bool] = {}
    for n in joint.graph.nodes:
        is_bw[n] = _is_tangent(n) or any(is_bw.get(a, False) for a in n.all_input_nodes)
    costs, sizes, deps, names, kinds = [], [], [], [], []
    for n in nodes:
        d: Set[int] = set()
        for a in n.all_input_nodes:
            for b in (a, _root(a)):
                if b in index:
                    d.add(index[b])
        bw = is_bw[n]
        backward.append(bw)
        c = float(cost(n))
        if not (c >= 0.0 and c != float("inf")):
            raise ValueError(f"cost of {n.name} is {c}: give finite non-negative costs")
        costs.append(c)
        sizes.append(0 if _is_view(n) else _tensor_bytes(n.meta.get("val")))
        deps.append(sorted(d))
        names.append(n.name)
        kinds.append("backward" if bw else "forward")
    sink: Set[int] = set()
    for o in _flatten(_output(joint).args):
        for b in (o, _root(o)):
            if b in index:
                sink.add(index[b])
    costs.append(0.0)
    sizes.append(0)
    deps.append(sorted(sink))
    names.append("output")
    kinds.append("backward")
    backward.append(True)
    graph = _native.Graph(
        costs, sizes, deps, names=names, kinds=kinds, name=name, cost_unit="flops"
    )
    return Capture(joint, graph, nodes, index, backward, num_fwd_outputs, _mutated_inputs(joint))


def _mutated_inputs(joint: fx.GraphModule) -> Set[fx.Node]:
    """The placeholders whose data the step mutates: the inputs named by the joint graph's
    ``InputMutationAOTOutput`` output descriptors (torch 2.8+). Without descriptors, every primal
    that does not require a gradient (buffers, inputs) is taken as possibly mutated, so no operator
    reading one is recomputed."""
    placeholders = [n for n in joint.graph.nodes if n.op == "placeholder"]
    descs = _output(joint).meta.get("desc")
    if isinstance(descs, (list, tuple)) and any(d is not None for d in descs):
        targets = [getattr(d, "mutated_input", None) for d in descs]
        targets = [t for t in targets if t is not None]
        return {p for p in placeholders if p.meta.get("desc") in targets}
    return {
        p
        for p in placeholders
        if p.name.startswith("primals")
        and isinstance(p.meta.get("val"), torch.Tensor)
        and not p.meta["val"].requires_grad
    }


# ---------------------------------------------------------------------------------------------
# From a plan to torch's saved set, and the peak of the schedule torch then runs.


def saved_set(cap: Capture, plan: Sequence[Tuple[str, int]]) -> Tuple[List[fx.Node], List[fx.Node]]:
    """The forward values the backward reads from the forward (saved) and those it recomputes,
    from a plan of ``cap.graph``: a forward value is recomputed when the plan computes it again
    once the backward has begun, else saved. Random operators, and operators reading an input the
    step mutates (batch norm's running statistics), are saved whatever the plan says: torch's
    saved-tensor version check forbids reading a mutated input again. Parameters and inputs the
    backward reads are saved (they are held anyway)."""
    n_fw_steps = next(
        (k for k, (op, i) in enumerate(plan) if op == "compute" and cap.backward[i]), len(plan)
    )
    again = {
        cap.nodes[i]
        for op, i in plan[n_fw_steps:]
        if op == "compute" and i < len(cap.nodes) and not cap.backward[i]
    }
    fw_values = lambda n: n.op == "placeholder" and not _is_tangent(n) or (
        n in cap.index and not cap.backward[cap.index[n]]
    )
    stack = [
        a
        for n in cap.nodes
        if cap.backward[cap.index[n]]
        for a in n.all_input_nodes
        if fw_values(a)
    ]
    stack += [o for o in _flatten(_output(cap.joint).args)[cap.num_fwd_outputs:] if fw_values(o)]
    saved: Dict[fx.Node, None] = {}
    recomputed: Dict[fx.Node, None] = {}

    def recomputable(v: fx.Node) -> bool:
        # A tuple's elements (getitem) are saved, never the tuple itself; a view goes with its
        # base (saving a view of a recomputed tensor would hold the tensor twice).
        return (
            v in again
            and not _is_random(v)
            and not any(a in cap.mutated for a in v.all_input_nodes)
        )

    while stack:
        v = stack.pop()
        if v in saved or v in recomputed:
            continue
        if v.op == "call_function" and (
            recomputable(v.args[0])
            if v.target is operator.getitem
            else recomputable(_root(v))
            if _is_view(v)
            else recomputable(v)
        ):
            recomputed[v] = None
            stack.extend(v.all_input_nodes)
        else:
            saved[v] = None
    order = {n: k for k, n in enumerate(cap.joint.graph.nodes)}
    return sorted(saved, key=order.get), sorted(recomputed, key=order.get)


def _output(gm: fx.GraphModule) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.op == "output")


def schedule_peak(cap: Capture, fw: fx.GraphModule, bw: fx.GraphModule) -> int:
    """Peak bytes of the schedule torch runs with ``fw`` then ``bw``, in the model of the solver
    (measured right after each operator; a tensor's storage is live while any alias of it is;
    placeholders are held outside the step): what the partition really achieves, whatever the
    plan it came from."""
    by_name = {n.name: n for n in cap.joint.graph.nodes}
    storage_bytes: Dict[Tuple[str, int], int] = {}
    refs: Dict[Tuple[str, int], int] = {}
    live_nodes: Dict[str, List[Tuple[str, int]]] = {}

    def storages(n: fx.Node) -> List[Tuple[str, int]]:
        j = by_name.get(n.name, n)
        if n.op == "placeholder":
            return live_nodes.get(n.name, [])
        if n.target is operator.getitem:
            base = n.args[0]
            return [(base.name, int(n.args[1]))]
        if _is_view(j):
            src = n.args[0] if isinstance(n.args[0], fx.Node) else n.all_input_nodes[0]
            return list(live_nodes.get(src.name, []))
        val = j.meta.get("val")
        if isinstance(val, (tuple, list)):
            keys = []
            for k, v in enumerate(val):
                storage_bytes[(n.name, k)] = _tensor_bytes(v)
                keys.append((n.name, k))
            return keys
        storage_bytes[(n.name, 0)] = _tensor_bytes(val)
        return [(n.name, 0)]

    def hold(name: str, keys: List[Tuple[str, int]]) -> None:
        live_nodes[name] = keys
        for k in keys:
            refs[k] = refs.get(k, 0) + 1

    def drop(name: str) -> None:
        for k in live_nodes.pop(name, []):
            refs[k] -= 1
            if refs[k] == 0:
                del refs[k]

    def current() -> int:
        return sum(storage_bytes.get(k, 0) for k in refs)

    peak = 0

    def run(gm: fx.GraphModule) -> List[str]:
        nonlocal peak
        order = list(gm.graph.nodes)
        last: Dict[str, int] = {}
        for k, n in enumerate(order):
            for a in n.all_input_nodes:
                last[a.name] = k
        returned = [o.name for o in _flatten(_output(gm).args)]
        for k, n in enumerate(order):
            if n.op == "call_function":
                hold(n.name, storages(n))
                peak = max(peak, current())
                if n.name not in last and n.name not in returned:
                    drop(n.name)
            for a in n.all_input_nodes:
                if last.get(a.name) == k and a.name not in returned:
                    drop(a.name)
        return returned

    fw_out = run(fw)
    # The forward's outputs beyond the user's ones are the saved values the backward reads.
    bw_inputs = {n.name for n in bw.graph.nodes if n.op == "placeholder"}
    for name in list(live_nodes):
        if name not in bw_inputs and name not in fw_out[: cap.num_fwd_outputs]:
            drop(name)
    run(bw)
    return peak


# ---------------------------------------------------------------------------------------------
# The partition function.


@dataclasses.dataclass
class Report:
    """What one partition did (one per joint graph; ``Partitioner.reports``)."""

    nodes: int
    strategy: str
    status: str
    budget_bytes: int
    eager_peak_bytes: int
    plan_peak_bytes: int
    schedule_peak_bytes: int
    overhead: float
    saved: List[str]
    recomputed: List[str]
    solve_seconds: float
    attempts: int

    def summary(self) -> str:
        """One line: the predicted peaks and what the plan recomputes."""
        mib = lambda b: f"{b / 2**20:.0f} MiB"
        return (
            f"{self.strategy} ({self.status}) on {self.nodes} nodes: budget {mib(self.budget_bytes)}, "
            f"predicted peak {mib(self.schedule_peak_bytes)} (eager {mib(self.eager_peak_bytes)}), "
            f"{len(self.recomputed)} forward values recomputed, {len(self.saved)} saved, "
            f"+{100 * self.overhead:.1f}% compute, solved in {self.solve_seconds:.1f} s"
        )


def _budget_bytes(graph: "_native.Graph", budget: Budget) -> int:
    if isinstance(budget, bool):
        raise TypeError("budget: give a fraction in (0, 1], a byte count or a string like '2GiB'")
    if isinstance(budget, float):
        if not 0.0 < budget <= 1.0:
            raise ValueError(
                f"budget {budget}: a float is a fraction of the eager activation peak, in (0, 1]"
            )
        return int(budget * graph.checkpoint_all_peak)
    if isinstance(budget, int):
        if budget <= 0:
            raise ValueError(f"budget {budget}: give a positive number of bytes")
        return budget
    if isinstance(budget, str):
        # The native parser reads units ("512MiB") and percentages of the checkpoint-all peak.
        return int(_native.solve(graph, budget, "checkpoint-all")["activation_budget_bytes"])
    raise TypeError(f"budget {budget!r}: give a fraction in (0, 1], a byte count or a string")


class Partitioner:
    """A ``partition_fn`` for AOTAutograd that applies a checkmate plan.

    ``budget``: a float in (0, 1] is a fraction of the eager activation peak (every forward value
    the backward reads saved, nothing recomputed), an int a number of bytes, a string a size such
    as ``"512MiB"``; it bounds the memory the step allocates above what is held before it
    (parameters, gradients, inputs). The plan (``strategy``, default ``lp-round``) is projected onto
    what torch can run (the forward once, then a backward that recomputes forward values just
    before their first use) and that schedule's peak is checked against the budget; when over, the
    solve is repeated with the budget lowered by the excess (up to ``attempts`` times) and the
    best schedule is kept. ``reports`` lists what each call did.
    """

    def __init__(
        self,
        budget: Budget = 0.6,
        strategy: str = "lp-round",
        *,
        time_limit: Optional[float] = 30.0,
        cost: Optional[Callable[[fx.Node], float]] = None,
        attempts: int = 4,
    ) -> None:
        if strategy not in _native.strategies():
            raise ValueError(
                f"unknown strategy {strategy!r}; known: {', '.join(_native.strategies())}"
            )
        self.budget = budget
        self.strategy = strategy
        self.time_limit = time_limit
        self.cost = cost
        self.attempts = max(1, attempts)
        self.reports: List[Report] = []
        self.captures: List[Capture] = []
        #: The (forward, backward) graph modules handed to torch, one pair per call.
        self.modules: List[Tuple[fx.GraphModule, fx.GraphModule]] = []

    def __call__(
        self, joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any
    ) -> Tuple[fx.GraphModule, fx.GraphModule]:
        from torch._functorch import partitioners as P

        joint_module.graph.eliminate_dead_code()
        joint_module.recompile()
        cap = to_graph(joint_module, num_fwd_outputs, self.cost)
        self.captures.append(cap)
        g = cap.graph
        target = _budget_bytes(g, self.budget)
        eager_saved, _ = saved_set(cap, [("compute", i) for i in range(len(g))])
        fw0, bw0 = self._extract(P, joint_module, eager_saved, num_fwd_outputs, kwargs)
        eager_peak = schedule_peak(cap, fw0, bw0)
        best = None
        ask = target
        attempts = 0
        seconds = 0.0
        for _ in range(self.attempts):
            attempts += 1
            try:
                res = _native.solve(g, ask, self.strategy, time_limit=self.time_limit)
            except _native.CheckmateError:
                if best is None:
                    raise
                break  # a lower budget for the plan has none: keep the best schedule so far
            seconds += res["solve_seconds"] or 0.0
            saved, recomputed = saved_set(cap, res["plan"])
            fw, bw = self._extract(P, joint_module, saved, num_fwd_outputs, kwargs)
            peak = schedule_peak(cap, fw, bw)
            if best is None or (best[0] > target and peak < best[0]):
                best = (peak, res, saved, recomputed, fw, bw)
            if peak <= target:
                break
            # Lower the plan's budget by the excess, but never below halfway to the floor.
            floor = g.min_feasible_activation_bytes
            ask = ask - min(peak - target, max(0, (ask - floor) // 2))
            if ask <= floor:
                break
        peak, res, saved, recomputed, fw, bw = best
        self.modules.append((fw, bw))
        self.reports.append(
            Report(
                nodes=len(g),
                strategy=res["strategy"],
                status=res["status"],
                budget_bytes=target,
                eager_peak_bytes=eager_peak,
                plan_peak_bytes=res["peak_bytes"],
                schedule_peak_bytes=peak,
                overhead=res["overhead"],
                saved=[n.name for n in saved],
                recomputed=[n.name for n in recomputed],
                solve_seconds=seconds,
                attempts=attempts,
            )
        )
        return fw, bw

    @staticmethod
    def _extract(P: Any, joint: fx.GraphModule, saved: List[fx.Node], nfo: int, kwargs: Dict) -> Any:
        values = [n for n in saved if not P.is_sym_node(n)]
        syms = [n for n in saved if P.is_sym_node(n)]
        fw, bw = P._extract_fwd_bwd_modules(joint, values, syms, num_fwd_outputs=nfo)
        bw = P.reordering_to_mimic_autograd_engine(bw)
        return fw, bw


def _boxed(gm: fx.GraphModule, example_inputs: Any) -> Callable:
    """Runs ``gm`` op by op with the boxed calling convention: the argument list is emptied once
    read and every value is dropped after its last use, so saved tensors are freed as the backward
    consumes them (``make_boxed_func`` keeps its argument list, and with it every saved tensor,
    alive until the call returns)."""
    interpreter = fx.Interpreter(gm, garbage_collect_values=True)

    def run(args: List[Any]) -> Any:
        try:
            return interpreter.boxed_run(args)
        finally:
            interpreter.env = {}  # the interpreter keeps its last environment otherwise

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def compile(
    fn: Callable,
    budget: Budget = 0.6,
    strategy: str = "lp-round",
    *,
    time_limit: Optional[float] = 30.0,
    cost: Optional[Callable[[fx.Node], float]] = None,
) -> Callable:
    """``fn`` (a module or a function computing the loss) compiled by ``torch.compile`` with a
    ``Partitioner``: the backward recomputes what the plan recomputes. The partitioner is the
    result's ``checkmate`` attribute (its ``reports`` fill in on the first call)."""
    from torch._dynamo.backends.common import aot_autograd

    part = Partitioner(budget, strategy, time_limit=time_limit, cost=cost)
    backend = aot_autograd(fw_compiler=_boxed, bw_compiler=_boxed, partition_fn=part)
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    try:
        compiled.checkmate = part  # type: ignore[attr-defined]
    except AttributeError:
        pass
    return compiled


def capture(fn: Callable, *args: Any, **kwargs: Any) -> Capture:
    """The joint forward/backward graph of ``fn(*args, **kwargs)`` (one forward call is run,
    through ``torch.compile`` with the default partition) as a ``Capture``; the first joint graph
    when graph breaks split ``fn``."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition

    caps: List[Capture] = []

    def record(joint: fx.GraphModule, inputs: Any, *, num_fwd_outputs: int, **kw: Any) -> Any:
        joint.graph.eliminate_dead_code()
        joint.recompile()
        caps.append(to_graph(joint, num_fwd_outputs))
        return default_partition(joint, inputs, num_fwd_outputs=num_fwd_outputs, **kw)

    backend = aot_autograd(fw_compiler=_boxed, bw_compiler=_boxed, partition_fn=record)
    torch._dynamo.reset()
    torch.compile(fn, backend=backend, dynamic=False)(*args, **kwargs)
    if not caps:
        raise ValueError("no joint graph: fn computed nothing that needs gradients")
    return caps[0]


# ---------------------------------------------------------------------------------------------
# torch's activation_memory_budget knapsack, solved exactly.


def _knapsack_base() -> type:
    try:
        from torch._inductor.custom_graph_pass import CustomKnapsackSolver

        return CustomKnapsackSolver
    except ImportError:  # torch before CustomKnapsackSolver: a plain callable is accepted
        return object


class KnapsackSolver(_knapsack_base()):  # type: ignore[misc]
    """``torch._functorch.config.activation_memory_budget_solver = KnapsackSolver()``: torch's
    knapsack (save the candidates whose recomputation costs most, within the memory budget) solved
    exactly with HiGHS. Runtimes are ``flop_cost`` of each candidate (from shapes; torch's own
    ``estimate_runtime`` runs the operator on uninitialized tensors, which fails for index
    arguments such as a loss's targets). ``calls`` records each solve (items, budget, saved runtime, optimal)."""

    def __init__(self, time_limit: Optional[float] = 10.0) -> None:
        self.time_limit = time_limit
        self.calls: List[Dict[str, Any]] = []

    def __call__(
        self,
        memory: List[float],
        joint_graph: fx.Graph,
        max_memory: float,
        node_info: Any = None,
        all_recomputable_banned_nodes: Optional[List[fx.Node]] = None,
        runtimes: Optional[List[float]] = None,
    ) -> Tuple[List[int], List[int]]:
        if runtimes is None:
            nodes = all_recomputable_banned_nodes or []
            if len(nodes) != len(memory):
                raise ValueError(
                    f"{len(memory)} memories but {len(nodes)} candidate nodes: "
                    "torch passed arguments this solver does not know"
                )
            runtimes = [flop_cost(n) for n in nodes]
        res = _native.knapsack(
            [max(0.0, float(r)) for r in runtimes],
            [max(0.0, float(m)) for m in memory],
            max(0.0, float(max_memory)),
            time_limit=self.time_limit,
        )
        saved = list(res["chosen"])
        chosen = set(saved)
        recomputed = [i for i in range(len(memory)) if i not in chosen]
        self.calls.append(
            {
                "items": len(memory),
                "max_memory": float(max_memory),
                "saved_runtime": res["value"],
                "saved_memory": res["weight"],
                "optimal": res["optimal"],
            }
        )
        return saved, recomputed

    def uuid(self) -> Any:
        return ("checkmate_rs.KnapsackSolver", _native.__version__)


# ---------------------------------------------------------------------------------------------
# Measuring.


def measure_peak(step: Callable[[], Any], device: Union[str, torch.device] = "cpu") -> int:
    """Peak bytes allocated during ``step()`` above what was allocated when it began: on CUDA
    ``torch.cuda.max_memory_allocated``; on the CPU the running sum of the profiler's memory
    events (``profile_memory=True``), the data behind torch's memory timeline."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [
        e
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    ]
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for e in events:
        current += e.nbytes()
        peak = max(peak, current)
    return int(peak)


# ---------------------------------------------------------------------------------------------
# Eager mode: a selective activation checkpointing policy.


def _op_key(target: Any) -> str:
    """An operator's name without overload and functionalization suffixes, as eager mode and the
    joint graph both call it (``_native_batch_norm_legit_functional`` -> ``_native_batch_norm_legit``)."""
    name = str(getattr(target, "overloadpacket", target)).split(".")[-1]
    return name.removesuffix("_functional")


@dataclasses.dataclass
class Policy:
    """A plan expressed per operator type, for ``torch.utils.checkpoint``'s selective
    checkpointing: operators of the types in ``save`` keep their outputs, the others are
    recomputed. ``agreement`` is the fraction of the plan's decisions (saved or recomputed forward
    values, views excluded) this per-type rule reproduces: 1.0 when the plan treats every operator
    of a type alike, which is when it can be expressed this way."""

    save: Set[str]
    recompute: Set[str]
    agreement: float

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import CheckpointPolicy

        key = _op_key(op)
        if key in self.recompute:
            return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE

    def context_fn(self) -> Any:
        """For ``torch.utils.checkpoint.checkpoint(fn, ..., use_reentrant=False,
        context_fn=policy.context_fn)``."""
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        return create_selective_checkpoint_contexts(self)


def policy(report: Report, cap: Capture) -> Policy:
    """The per-operator-type rule closest to a partition's plan (majority per type; random
    operators always saved)."""
    by_name = {n.name: n for n in cap.nodes}
    votes: Dict[str, List[int]] = {}
    for names, k in ((report.saved, 0), (report.recomputed, 1)):
        for name in names:
            n = by_name.get(name)
            if n is None or _is_view(n) or n.target is operator.getitem:
                continue
            votes.setdefault(_op_key(n.target), [0, 0])[k] += 1
    save = {op for op, (s, r) in votes.items() if s >= r}
    recompute = {op for op, (s, r) in votes.items() if r > s}
    recompute = {op for op in recompute if not any(_is_random(n) and _op_key(n.target) == op for n in cap.nodes)}
    total = sum(s + r for s, r in votes.values())
    agree = sum(max(s, r) for s, r in votes.values())
    return Policy(save, recompute, agree / total if total else 1.0)
