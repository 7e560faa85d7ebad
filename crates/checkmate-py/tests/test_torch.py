"""The PyTorch front (checkmate_rs.torch) on a small MLP, a small CNN and torchvision's ResNet-18
(random weights): the backward recomputes what the plan says, gradients equal eager ones, and the
measured peak is below eager's at a tight budget. Skipped without torch unless
CHECKMATE_REQUIRE_TORCH is set (as `cargo xtask ci` does)."""

import os
import re
from pathlib import Path

import pytest

if os.environ.get("CHECKMATE_REQUIRE_TORCH"):
    import torch
else:
    torch = pytest.importorskip("torch")

import checkmate_rs as cm
import checkmate_rs.torch as cmt

ROOT = Path(__file__).resolve().parents[3]


def mlp():
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 10))
    return model, torch.randn(2048, 256), torch.randint(0, 10, (2048,))


def cnn(bn=True):
    torch.manual_seed(0)
    norm = lambda o: [torch.nn.BatchNorm2d(o)] if bn else []
    c = lambda i, o: [torch.nn.Conv2d(i, o, 3, padding=1), *norm(o), torch.nn.ReLU()]
    model = torch.nn.Sequential(
        *c(3, 16), *c(16, 16), torch.nn.MaxPool2d(2), *c(16, 32), *c(32, 32), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 10),
    )
    return model, torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))


def resnet18():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    return model, torch.randn(16, 3, 128, 128), torch.randint(0, 10, (16,))


def run_case(make, budget, time_limit=10.0):
    torch._dynamo.reset()
    model, x, y = make()
    loss_fn = lambda x, y: torch.nn.functional.cross_entropy(model(x), y)
    step = cmt.compile(loss_fn, budget=budget, time_limit=time_limit)

    def eager():
        model.zero_grad(set_to_none=False)
        loss_fn(x, y).backward()

    def planned():
        model.zero_grad(set_to_none=False)
        step(x, y).backward()

    eager()
    # Batch norm's running statistics move with every step: compare from the same state.
    state = {k: v.clone() for k, v in model.state_dict().items()}
    eager()
    expected = [p.grad.clone() for p in model.parameters()]
    model.load_state_dict(state)
    planned()
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g)
    part = step.checkmate
    return part, cmt.measure_peak(eager), cmt.measure_peak(planned)


def check_recomputes_what_the_plan_says(part):
    (report,) = part.reports
    ((fw, bw),) = part.modules
    cap = part.captures[0]
    forward = {n.name for i, n in enumerate(cap.nodes) if not cap.backward[i]}
    in_backward = {n.name for n in bw.graph.nodes if n.op == "call_function" and n.name in forward}
    assert in_backward == set(report.recomputed)
    # Saved values are the backward graph's inputs besides the incoming gradients.
    bw_inputs = {n.name for n in bw.graph.nodes if n.op == "placeholder"}
    assert set(report.saved) <= bw_inputs
    # Something expensive is recomputed, not only views.
    by_name = {n.name: n for n in cap.nodes}
    assert any(not cmt._is_view(by_name[name]) for name in report.recomputed)


@pytest.mark.parametrize("make,budget", [(mlp, 0.7), (cnn, 0.5), (resnet18, 0.6)])
def test_plan_is_applied_with_eager_gradients_and_a_lower_peak(make, budget):
    part, eager_peak, planned_peak = run_case(make, budget)
    check_recomputes_what_the_plan_says(part)
    (report,) = part.reports
    print(make.__name__, report.summary(), f"measured eager {eager_peak} planned {planned_peak}")
    assert report.schedule_peak_bytes < report.eager_peak_bytes
    assert planned_peak < eager_peak, (planned_peak, eager_peak)


def test_checkpoint_all_recomputes_no_operator():
    torch._dynamo.reset()
    model, x, y = cnn()
    step = cmt.compile(lambda x, y: torch.nn.functional.cross_entropy(model(x), y), 1.0, "checkpoint-all")
    step(x, y).backward()
    (report,) = step.checkmate.reports
    cap = step.checkmate.captures[0]
    by_name = {n.name: n for n in cap.nodes}
    # Only views (free) may be re-derived in the backward.
    assert all(cmt._is_view(by_name[r]) for r in report.recomputed), report.recomputed


def test_capture_maps_the_joint_graph():
    model, x, y = cnn()
    cap = cmt.capture(lambda x, y: torch.nn.functional.cross_entropy(model(x), y), x, y)
    g = cap.graph
    assert len(g) == len(cap.nodes) + 1 and g.names[-1] == "output"
    convs = [n for n in cap.nodes if "convolution" in str(n.target) and not cap.backward[cap.index[n]]]
    assert len(convs) == 4
    # A 3x3 convolution's cost is dominated by its FLOPs: 2 * k * k * cin * cout * h * w * batch.
    first = convs[0]
    assert cmt.flop_cost(first) >= 2 * 9 * 3 * 16 * 32 * 32 * 32
    r = cm.solve(g, "100%", "checkpoint-all")
    assert r["peak_bytes"] == g.checkpoint_all_peak


def test_too_small_a_budget_names_the_least_feasible_one():
    torch._dynamo.reset()
    model, x, y = mlp()
    step = cmt.compile(lambda x, y: torch.nn.functional.cross_entropy(model(x), y), 0.01)
    with pytest.raises(Exception, match=r"too small|no plan"):
        step(x, y)


def test_bad_budgets_are_rejected():
    with pytest.raises(ValueError, match="fraction"):
        cmt._budget_bytes(cm.Graph(costs=[1], bytes=[4], deps=[[]]), 1.5)
    with pytest.raises(ValueError, match="unknown strategy"):
        cmt.Partitioner(0.5, "simulated-annealing")


def test_knapsack_solver_is_exact_and_plugs_into_torch():
    import itertools

    solver = cmt.KnapsackSolver()
    memory = [0.3, 0.2, 0.25, 0.1, 0.15]
    runtimes = [5.0, 4.0, 3.0, 1.0, 2.5]
    saved, recomputed = solver(memory, None, 0.5, runtimes=runtimes)
    assert sorted(saved + recomputed) == list(range(5))
    best = max(
        sum(runtimes[i] for i in s)
        for k in range(6)
        for s in itertools.combinations(range(5), k)
        if sum(memory[i] for i in s) <= 0.5
    )
    assert sum(runtimes[i] for i in saved) == pytest.approx(best)

    from torch._functorch import config

    torch._dynamo.reset()
    model, x, y = mlp()
    loss_fn = lambda x, y: torch.nn.functional.cross_entropy(model(x), y)
    loss_fn(x, y).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    solver = cmt.KnapsackSolver()
    with config.patch(activation_memory_budget=0.3, activation_memory_budget_solver=solver):
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        backend = aot_autograd(
            fw_compiler=cmt._boxed, bw_compiler=cmt._boxed,
            partition_fn=min_cut_rematerialization_partition,
        )
        torch.compile(loss_fn, backend=backend)(x, y).backward()
    assert solver.calls and all(c["optimal"] for c in solver.calls)
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g)


def test_readme_example_runs_as_written():
    """The torch example of README.md, run as written (ResNet-18, batch 32, 224x224)."""
    if not os.environ.get("CHECKMATE_README_EXAMPLE"):
        pytest.skip("set CHECKMATE_README_EXAMPLE=1 (cargo xtask ci does) to run ResNet-18 at 224")
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- torch-example -->\s*```python\n(.*?)```", text, re.S)
    assert m, "README.md has no ```python block after <!-- torch-example -->"
    pytest.importorskip("torchvision")
    torch._dynamo.reset()
    exec(compile(m.group(1), "README.md", "exec"), {})


def test_eager_selective_checkpointing_policy_from_a_plan():
    """The plan as a per-operator-type policy for torch.utils.checkpoint, one region per
    convolution block: gradients equal eager ones, the recomputed operator types run again in the
    backward, the saved ones do not, and the peak is below eager's. Without batch norm: torch's
    selective checkpointing refuses cached tensors that are mutated later (the running statistics),
    and recomputing batch norm in training mode would update them twice."""
    from torch.utils.checkpoint import checkpoint
    from torch.utils._python_dispatch import TorchDispatchMode

    plain = lambda: cnn(bn=False)
    part, _, _ = run_case(plain, 0.7)
    pol = cmt.policy(part.reports[0], part.captures[0])
    print("policy", pol)
    assert pol.recompute and 0.5 < pol.agreement <= 1.0
    model, x, y = plain()
    blocks, i, mods = [], 0, list(model)
    while i < len(mods):  # conv, batch norm, ReLU [, pool] per region; the head alone
        j = i + 2 if isinstance(mods[i], torch.nn.Conv2d) else len(mods)
        if j < len(mods) and isinstance(mods[j], torch.nn.MaxPool2d):
            j += 1
        blocks.append(torch.nn.Sequential(*mods[i:j]))
        i = j

    def forward(sac):
        h = x
        for b in blocks:
            h = checkpoint(b, h, use_reentrant=False, context_fn=pol.context_fn) if sac else b(h)
        return torch.nn.functional.cross_entropy(h, y)

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(cmt._op_key(func))
            return func(*args, **(kwargs or {}))

    def step(sac):
        model.zero_grad(set_to_none=False)
        loss = forward(sac)
        with Count() as c:
            loss.backward()
        return c.ops

    state = {k: v.clone() for k, v in model.state_dict().items()}
    step(False)
    expected = [p.grad.clone() for p in model.parameters()]
    model.load_state_dict(state)
    in_backward = step(True)
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g)
    for op in pol.recompute:
        assert op in in_backward, (op, "not recomputed")
    for op in pol.save - pol.recompute:
        assert op not in in_backward or op.endswith("_backward"), (op, "recomputed")
    eager_peak = cmt.measure_peak(lambda: step(False))
    sac_peak = cmt.measure_peak(lambda: step(True))
    print("sac", sac_peak, "eager", eager_peak)
    assert sac_peak < eager_peak
