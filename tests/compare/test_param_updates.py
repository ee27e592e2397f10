"""Parameter updates in the comparison (rlprobe/comparison/params.py): real PPO runs of
examples/ppo/tiny_ppo.py whose fingerprints name the update that differs before a forward is blamed."""

from __future__ import annotations

import openpyxl
import pyarrow.parquet as pq
import pytest

import rlprobe
from rlprobe.demo import load_config, load_example_module


# each run's fault and config overrides, in one place: a name means the same run whichever test trains it first
RUNS = {
    "base": (None, {}),
    "base_again": (None, {}),
    "critic_lr": (None, {"ppo.critic_lr": 0.003}),
    "actor_lr": ("lr", {}),
    "off": (None, {"rlprobe_config.param_fingerprints": False}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name (of RUNS) -> dump of a 2-step PPO run (trained once per module)."""
    root = tmp_path_factory.mktemp("ppo_params")
    example = load_example_module()
    made = {}

    def get(name: str):
        if name not in made:
            fault, overrides = RUNS[name]
            made[name] = example.train(load_config({"ppo.steps": 2, **overrides}), str(root / name), fault=fault)
        return made[name]
    return get


def test_a_changed_critic_lr_names_the_critic_update_of_step_0_not_its_forward(runs, tmp_path):
    summary = rlprobe.compare(runs("base"), runs("critic_lr"), tmp_path / "o")
    assert (summary["first_divergence"]["key"], summary["first_divergence"]["step"]) == ("values", 1)
    assert "-> the update of step 0 differs for model 'critic' (first parameter 'embed.weight'" in summary["suspect"]
    assert "the critic's forward" not in summary["suspect"] and summary["next_config"] is None
    assert "learning rate changed: ppo.critic_lr" in summary["suspect"]  # the config diff still leads
    found = summary["param_first_difference"]
    assert (found["monitor"], found["probe_step"], found["param"], found["status"]) == \
        ("critic", 0, "embed.weight", "differs")
    params = pq.read_table(tmp_path / "o" / "params.parquet").to_pylist()
    # the actor's step-0 update saw the same data; from step 1 the advantages (made from values) differ
    assert {r["status"] for r in params if r["monitor"] == "actor" and r["step"] == 0} == {"match"}
    md = (tmp_path / "o" / "summary.md").read_text(encoding="utf-8")
    assert "parameter updates: the update of step 0 differs first for model 'critic'" in md
    sheet = openpyxl.load_workbook(tmp_path / "o" / "report.xlsx", read_only=True)["Param updates"]
    assert next(sheet.iter_rows(values_only=True))[:4] == ("monitor", "rank", "step", "param")


def test_a_changed_actor_lr_names_the_actor_update_before_the_new_responses(runs, tmp_path):
    summary = rlprobe.compare(runs("base"), runs("actor_lr"), tmp_path / "o")
    assert (summary["first_divergence"]["key"], summary["first_divergence"]["step"]) == ("responses", 1)
    assert "the update of step 0 differs for model 'actor' (first parameter 'embed.weight'" in summary["suspect"]
    assert summary["param_first_difference"]["monitor"] == "actor"


def test_a_clean_pair_has_equal_fingerprints(runs, tmp_path):
    summary = rlprobe.compare(runs("base"), runs("base_again"), tmp_path / "o")
    assert summary["first_divergence"] is None and summary["param_first_difference"] is None
    params = pq.read_table(tmp_path / "o" / "params.parquet")
    assert params.num_rows == summary["params_compared"] > 0
    assert set(params["status"].to_pylist()) == {"match"}


def test_runs_without_fingerprints_have_no_param_finding(runs, tmp_path):
    off = runs("off")
    assert rlprobe.open(off).arrow("param").num_rows == 0
    summary = rlprobe.compare(off, off, tmp_path / "o")
    assert "params_compared" not in summary and summary["param_first_difference"] is None
    assert not (tmp_path / "o" / "params.parquet").exists()


def _sgd_run(path, nudge_at: int | None = None, scale: float | None = None):
    """A small model's 2 SGD steps with monitor_params; `nudge_at`: after that step, one weight moved by one
    float32 unit in the last place, or times `scale` (hooked before the monitor, so the fingerprint sees it)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    count = [0]

    def nudge(optimizer, args, kwargs):
        if count[0] == nudge_at:
            with torch.no_grad():
                w = model[2].weight
                w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(float("inf"))) if scale is None else w[0, 0] * scale
        count[0] += 1
    opt.register_step_post_hook(nudge)
    g = torch.Generator().manual_seed(1)
    with rlprobe.Probe(path) as probe:
        probe.monitor_params(model, optimizer=opt, name="actor")
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(16, 8, generator=g)).pow(2).mean().backward()
            opt.step()
            probe.step()
    return path


def test_weights_apart_by_rounding_are_close_and_bitwise_sees_them(tmp_path):
    from rlprobe.comparison.params import compare_params
    from rlprobe.comparison.tolerance import Tolerance

    a, b = rlprobe.open(_sgd_run(tmp_path / "a")), rlprobe.open(_sgd_run(tmp_path / "b", nudge_at=1))
    params, firsts = compare_params(a, b, exact=True)
    moved = [r for r in params.to_pylist() if r["status"] != "match"]
    assert [(r["step"], r["param"], r["status"]) for r in moved] == [(1, "2.weight", "close")] and firsts == []
    assert 0 < moved[0]["rel_err"] <= moved[0]["rtol"] == 2.0**-23 * 128  # float32's default
    _, strict = compare_params(a, b, exact=True, tolerance=Tolerance(rtol=0.0, atol=0.0))
    assert [(f["step"], f["param"], f["status"]) for f in strict] == [(1, "2.weight", "differs")]
    # beyond rounding: a weight moved by 1/128 of itself (2^16 ulps) is an update that differed
    c = rlprobe.open(_sgd_run(tmp_path / "c", nudge_at=1, scale=1 + 2.0**-7))
    _, found = compare_params(a, c, exact=True)
    assert [(f["step"], f["param"], f["status"]) for f in found] == [(1, "2.weight", "differs")]


def _adam_run(path, sign: float = 1.0, lr: float = 0.01, grads: bool = True, config: bool = True):
    """Two Adam steps of a small classifier whose `shift`, one constant added to every logit, has a true gradient
    of zero (softmax ignores it): its gradient is set to a few float32 units in the last place of the step's
    largest gradient, with `sign`: rounding that differs in sign between runs, as two devices round."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    model.shift = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def rounding(optimizer, args, kwargs):  # registered before the monitors: they see this gradient
        largest = max(float(p.grad.norm()) for p in model.parameters() if p is not model.shift)
        model.shift.grad = sign * largest * 2.0**-23 * torch.tensor([1.0, -2.0, 3.0, -1.0])
    opt.register_step_pre_hook(rounding)
    g = torch.Generator().manual_seed(1)
    with rlprobe.Probe(path) as probe:
        if config:
            probe.save_config({"optim": {"lr": lr}})
        if grads:
            probe.monitor_grads(model, optimizer=opt, name="actor", level="L1")
        probe.monitor_params(model, optimizer=opt, name="actor")
        for _ in range(2):
            opt.zero_grad()
            x = torch.randn(16, 8, generator=g)
            logits = model(x) + model.shift.sum()
            torch.nn.functional.cross_entropy(logits, torch.arange(16) % 3).backward()
            opt.step()
            probe.step()
    return path


def test_weights_apart_only_where_gradients_are_rounding_are_noise_the_optimizer_amplified(tmp_path):
    """Adam normalises each element: a gradient of rounding whose sign differs becomes a step of lr either way,
    so `shift` differs after update 0 beyond rounding while every solid gradient is equal."""
    summary = rlprobe.compare(_adam_run(tmp_path / "a"), _adam_run(tmp_path / "b", sign=-1.0), tmp_path / "o",
                              reports=False)
    found = summary["param_first_difference"]
    assert (found["param"], found["step"], found["status"]) == ("shift", 0, "differs")
    assert found["gradients"]["differing"] == found["gradients"]["differing_near_zero"] == 1
    noise = summary["update_noise"]
    assert (noise["monitor"], noise["update"], noise["params"], noise["near_zero"], noise["first_param"]) == \
        ("actor", 0, 1, 1, "shift")
    assert summary["suspect"].startswith("rounding noise amplified by the optimizer: after update 0 of model 'actor'")
    assert "--control" in summary["advice"]
    params = pq.read_table(tmp_path / "o" / "params.parquet").to_pylist()
    assert {r["status"] for r in params if r["step"] == 0 and r["param"] != "shift"} == {"match"}


def test_a_changed_learning_rate_is_a_changed_update_even_where_rounding_differs_too(tmp_path):
    a = _adam_run(tmp_path / "a")
    summary = rlprobe.compare(a, _adam_run(tmp_path / "b", sign=-1.0, lr=0.02), tmp_path / "o", reports=False)
    assert summary["update_noise"] is None  # solid gradients updated otherwise, and the config says why
    assert summary["param_first_difference"]["gradients"]["differing_solid"] > 0
    assert "the update of step 0 differs for model 'actor'" in summary["suspect"]
    # the learning rate alike in the configs but not in the optimizer (set in code): the solid gradients tell
    summary = rlprobe.compare(a, _adam_run(tmp_path / "c", lr=0.02, config=False), tmp_path / "o2", reports=False)
    assert summary["update_noise"] is None and "the update of step 0 differs" in summary["suspect"]


def test_a_changed_optimizer_setting_is_no_noise_even_where_only_rounding_gradients_differ(tmp_path):
    from rlprobe.comparison.params import update_noise

    found = {"monitor": "actor", "step": 0, "probe_step": 0, "rank": 0,
             "gradients": {"differing": 1, "differing_solid": 0, "differing_missing": 0, "params": 5,
                           "differing_near_zero": 1, "differing_sign_flipped": 0, "first_param": "shift"}}
    assert update_noise(found, []) is not None
    assert update_noise(found, ["optim.lr"]) is None
    assert update_noise({**found, "gradients": None}, []) is None


def test_without_gradients_the_verdict_says_the_evidence_is_missing(tmp_path):
    summary = rlprobe.compare(_adam_run(tmp_path / "a", grads=False), _adam_run(tmp_path / "b", sign=-1.0, grads=False),
                              tmp_path / "o", reports=False)
    assert summary["update_noise"] is None
    assert "the update of step 0 differs for model 'actor' (first parameter 'shift'" in summary["suspect"]
    assert "the gradients of that update were not captured" in summary["suspect"] and "monitor_grads" in summary["suspect"]


def test_the_parameter_line_says_the_difference_is_amplified_rounding(tmp_path):
    rlprobe.compare(_adam_run(tmp_path / "a"), _adam_run(tmp_path / "b", sign=-1.0), tmp_path / "o")
    md = (tmp_path / "o" / "summary.md").read_text(encoding="utf-8")
    assert ("parameter updates: the update of step 0 differs first for model 'actor' (first parameter 'shift'"
            in md)
    assert "rounding noise amplified by the optimizer: only the 1 of 5 parameters whose gradients were rounding" in md
