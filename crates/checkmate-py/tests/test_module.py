"""checkmate_rs without torch: graphs, solve, simulate, sweep, errors, the GIL, and the same
answers as the `checkmate` binary on the shared Checkmate graphs.

Run by `cargo xtask ci` (xtask/src/python.rs) with the module built from this crate on PYTHONPATH
and CHECKMATE_BIN naming the `checkmate` binary of the same build.
"""

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

import checkmate_rs as cm

ROOT = Path(__file__).resolve().parents[3]
GRAPHS = ROOT / "data" / "graphs" / "checkmate"
BIN = os.environ.get("CHECKMATE_BIN", str(ROOT / "target" / "debug" / "checkmate"))


def cli(*args):
    out = subprocess.run([BIN, *args], capture_output=True, text=True)
    return out.returncode, out.stdout, out.stderr


def chain(n=6, size=10):
    """A training chain: n forward nodes, a loss, n backward nodes."""
    costs, sizes, deps, kinds = [], [], [], []
    for i in range(n):
        costs.append(1.0)
        sizes.append(size)
        deps.append([i - 1] if i else [])
        kinds.append("forward")
    costs.append(1.0)
    sizes.append(size)
    deps.append([n - 1])
    kinds.append("loss")
    for j in range(n - 1, -1, -1):
        b = len(costs)
        d = [j, b - 1] + ([j - 1] if j else [])
        costs.append(2.0)
        sizes.append(size)
        deps.append(sorted(d))
        kinds.append("backward")
    return cm.Graph(costs=costs, bytes=sizes, deps=deps, kinds=kinds, static_bytes=100, name="chain")


def test_graph_from_lists_round_trips_through_json():
    g = chain()
    assert len(g) == 13
    assert g.static_bytes == 100
    assert g.total_cost == 6 + 1 + 12
    back = cm.Graph.from_json(g.to_json())
    assert back.names == g.names and back.deps == g.deps
    assert g.checkpoint_all_peak > g.min_feasible_activation_bytes > 0


def test_solve_every_strategy_and_milp_is_never_worse():
    g = chain(8)
    budget = g.static_bytes + (g.checkpoint_all_peak + g.min_feasible_activation_bytes) // 2
    best = cm.solve(g, budget, "milp")
    assert best["status"] == "optimal"
    assert best["total_peak_bytes"] <= budget
    assert best["computes"] > len(g), "a tight budget recomputes"
    # Without a warm start nothing meets a bound before the MILP: the answer is HiGHS's.
    cold = cm.solve(g, budget, "milp", warm_start=False)
    assert cold["exact_model"] is True and cold["cost"] == best["cost"]
    for name in cm.strategies():
        try:
            r = cm.solve(g, budget, name, time_limit=5)
        except cm.CheckmateError:
            continue  # a baseline may find no plan at this budget
        assert r["total_peak_bytes"] <= budget, name
        assert r["cost"] >= best["cost"] - 1e-9, name
        if name not in ("milp", "lp-round"):
            assert r["exact_model"] is False, name
        assert cm.simulate(g, r["plan"])["cost"] == r["cost"]
        assert cm.simulate(g, r["plan_json"])["peak_bytes"] == r["peak_bytes"]


def test_budgets_as_text():
    g = chain()
    all_ = cm.solve(g, "100%", "checkpoint-all")
    assert all_["peak_bytes"] == g.checkpoint_all_peak
    assert all_["budget_bytes"] == g.static_bytes + g.checkpoint_all_peak
    assert cm.solve(g, "1KiB", "checkpoint-all")["budget_bytes"] == 1024


def test_errors_are_exceptions_with_the_message():
    g = chain()
    with pytest.raises(cm.CheckmateError, match="least"):
        cm.solve(g, g.static_bytes + 1, "milp")
    with pytest.raises(cm.CheckmateError, match="static"):
        cm.solve(g, 10, "milp")
    with pytest.raises(ValueError, match="unknown strategy"):
        cm.solve(g, "100%", "alexnet")
    with pytest.raises(ValueError, match="time_limit"):
        cm.solve(g, "100%", "milp", time_limit=-1)
    with pytest.raises(ValueError, match="entries for 3 nodes"):
        cm.Graph(costs=[1, 1, 1], bytes=[1, 1], deps=[[], [0], [1]])
    with pytest.raises(cm.CheckmateError, match="cycle"):
        cm.Graph(costs=[1, 1], bytes=[1, 1], deps=[[1], [0]])
    with pytest.raises(cm.CheckmateError):
        cm.Graph.from_json("{ not json")
    with pytest.raises(cm.CheckmateError):
        cm.Graph.read(ROOT / "no-such-graph.json")
    with pytest.raises(cm.CheckmateError):
        cm.simulate(g, [("compute", 5)])  # its input is not live
    with pytest.raises(ValueError, match="compute"):
        cm.simulate(g, [("run", 0)])


def test_sweep_gives_a_frontier():
    g = chain(6)
    points = cm.sweep(g, ["checkpoint-all", "milp"], points=3)
    milp = [p for p in points if p["strategy"] == "milp"]
    assert len(milp) == 3
    assert all(p["status"] in ("optimal", "feasible", "infeasible", "no-plan-found", "timeout") for p in points)
    costs = [p["cost"] for p in sorted(milp, key=lambda p: p["budget_bytes"]) if p["cost"] is not None]
    assert costs == sorted(costs, reverse=True), "more memory never costs more"


def test_solve_releases_the_gil():
    g = cm.Graph.read(GRAPHS / "MobileNet_512_224.json")
    done = threading.Event()

    def work():
        try:
            cm.solve(g, "40%", "lp-round", time_limit=2)
        finally:
            done.set()

    t = threading.Thread(target=work)
    t.start()
    ticks = 0
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    assert ticks > 100, f"the main thread ran only {ticks} times during the solve"


def shared_graphs():
    return sorted(GRAPHS.glob("*.json"), key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("path", shared_graphs(), ids=lambda p: p.stem)
def test_same_plans_and_costs_as_the_cli(path, tmp_path):
    g = cm.Graph.read(path)
    strategies = ["checkpoint-all", "chen-greedy", "griewank"]
    # The exact MILP on the five smaller graphs (a minute each on ResNet50 in a debug build).
    if os.path.getsize(path) < 20_000:
        strategies.append("milp")
    for name in strategies:
        plan_file = tmp_path / f"{name}.json"
        code, out, err = cli(
            "solve", "--graph", str(path), "--strategy", name, "--budget", "80%",
            "--time-limit", "60", "--json", "--plan-out", str(plan_file),
        )
        try:
            mine = cm.solve(g, "80%", name, time_limit=60)
        except cm.CheckmateError as e:
            assert code != 0, f"{name}: the CLI found a plan, Python: {e}"
            continue
        assert code == 0, f"{name}: Python found a plan, the CLI: {err}"
        theirs = json.loads(out.strip().splitlines()[-1])
        assert mine["cost"] == theirs["cost"], name
        assert mine["peak_bytes"] == theirs["peak_bytes"], name
        assert mine["status"] == theirs["status"], name
        steps = json.loads(plan_file.read_text())["steps"]
        ids = [int(n) for n in (g_id for g_id in _file_ids(g))]
        cli_plan = [(k, ids.index(v)) for s in steps for k, v in s.items()]
        # The baselines are deterministic; milp's warm start is a time-limited search, so among
        # plans of the proven optimal cost it may return another one.
        if name != "milp":
            assert mine["plan"] == cli_plan, name


def _file_ids(g):
    """The graph file's node ids, in node order."""
    return [n["id"] for n in json.loads(g.to_json())["nodes"]]


def test_knapsack_is_exact_and_names_bad_items():
    import itertools

    values, weights = [6.0, 5.0, 4.0, 3.0, 1.0], [5.0, 4.0, 3.0, 2.0, 1.0]
    r = cm.knapsack(values, weights, 9.0)
    best = max(
        sum(values[i] for i in s)
        for k in range(6)
        for s in itertools.combinations(range(5), k)
        if sum(weights[i] for i in s) <= 9.0
    )
    assert r["optimal"] and r["value"] == best and r["weight"] <= 9.0
    assert sum(values[i] for i in r["chosen"]) == best
    with pytest.raises(cm.CheckmateError, match="item 1's weight is -1"):
        cm.knapsack([1.0, 1.0], [1.0, -1.0], 1.0)
