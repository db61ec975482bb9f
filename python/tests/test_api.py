"""The planner from Python (`fsdpc.compile`, `auto`, `Plan`) against the
command line, and bad input as exceptions. Needs no torch."""

import json
import os
import subprocess
import sys

import pytest

import fsdpc
from fsdpc import FsdpcError, Plan


def mini(**flags):
    return fsdpc.compile("gpt-mini", world=2, cluster="cpu-local", **flags)


def test_importing_fsdpc_does_not_import_torch():
    code = "import fsdpc, sys; fsdpc.compile('gpt-mini', world=2); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_compile_writes_the_plan_the_command_line_writes(tmp_path, fsdpc_command):
    flags = dict(
        activation_checkpointing="every:2",
        mixed_precision="bf16",
        reshard_after_forward={"transformer.h.1": False},
        freeze=["transformer.wpe.*"],
        no_sync=True,
        grad_accum=2,
        forward_prefetch=False,
    )
    plan = fsdpc.compile("gpt-mini", world=4, cluster="h100-80g-ib", **flags)
    out = tmp_path / "cli.json"
    subprocess.run(
        [
            fsdpc_command, "compile", "gpt-mini", "--world", "4", "--cluster", "h100-80g-ib",
            "--activation-checkpointing", "every:2", "--mixed-precision", "bf16",
            "--reshard-after-forward", "transformer.h.1=false", "--freeze", "transformer.wpe.*",
            "--no-sync", "--grad-accum", "2", "--forward-prefetch", "false", "-o", str(out),
        ],
        check=True,
        capture_output=True,
    )
    assert json.loads(plan.to_json()) == json.loads(out.read_text())
    assert plan.config["param_dtype"] == "bf16"
    assert plan.config["grad_accum"] == 2


def test_plan_objects_say_what_was_decided():
    plan = mini(activation_checkpointing=True, reshard_after_forward={"transformer.h.1": False})
    units = plan.units
    assert units[0].is_root and units[0].module == ""
    assert [u.module for u in units[1:]] == ["transformer.h.0", "transformer.h.1"]
    assert all(u.checkpointed for u in units[1:]) and not units[0].checkpointed
    assert units[1].reshard_after_forward is True
    assert units[2].reshard_after_forward is False
    to_two = fsdpc.compile("gpt-mini", world=4, cluster="cpu-local", reshard_after_forward={"transformer.h.1": 2})
    assert to_two.units[2].reshard_after_forward == 2 and to_two.units[1].reshard_after_forward is True
    assert units[0].reshard_after_forward is False
    assert sum(u.numel for u in units) == plan.doc["model"]["params"]
    names = [p for u in units for p in u.params]
    assert len(names) == len(set(names)) and "transformer.wte.weight" in names
    m = plan.memory
    assert m.peak_bytes <= m.arena_bytes < m.rank_bytes
    assert m.breakdown["optimizer_state"] == 2 * m.breakdown["shard_params"]
    assert "transformer.h.0" in plan.summary()
    assert plan.summary_json()["rank_bytes"] == m.rank_bytes
    assert plan.model == "gpt-mini" and plan.world == 2 and plan.cluster == "cpu-local"
    assert "gpt-mini" in repr(plan)


def test_plans_save_load_and_round_trip(tmp_path):
    plan = mini()
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.load(path)
    assert again.to_json() == plan.to_json()
    assert Plan.from_json(plan.to_json()).units == plan.units
    with pytest.raises(FsdpcError, match="missing.json"):
        Plan.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 1}')
    with pytest.raises(FsdpcError, match="bad.json"):
        Plan.load(bad)
    with pytest.raises(TypeError):
        Plan.from_json(b"{}")
    # A model where a plan belongs, and a plan where a model belongs, are
    # named as what they are (the command line's reading of the file).
    model = tmp_path / "model.json"
    model.write_text(json.dumps(mini().doc["training"]))
    with pytest.raises(FsdpcError, match="an fsdpc IR model, not a plan"):
        Plan.load(model)
    with pytest.raises(FsdpcError, match="already a plan"):
        fsdpc.compile(path, world=2)


def test_a_saved_plan_trains_from_the_command_line(tmp_path, fsdpc_command):
    path = tmp_path / "plan.json"
    mini().save(path)
    run = subprocess.run(
        [fsdpc_command, "train", str(path), "--steps", "2"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "measured" in run.stdout + run.stderr


def test_simulate_on_the_plans_cluster_and_on_another():
    plan = mini()
    own = plan.simulate()
    assert own.step_time_s == pytest.approx(plan.step_time_s, rel=1e-12)
    assert own.cluster == "cpu-local" and own.world == 2
    h100 = plan.simulate("h100-80g-ib")
    assert h100.step_time_s < own.step_time_s
    assert 0 < h100.mfu <= h100.hfu <= 1
    assert h100.model_flops_per_rank_step <= h100.executed_flops_per_rank_step
    assert "simulated on h100-80g-ib" in str(h100)
    with pytest.raises(FsdpcError, match="no-such-cluster"):
        plan.simulate("no-such-cluster")


def test_simulate_prices_pytorch_eager_kernels():
    plan = fsdpc.compile(
        "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=512,seq=32,batch=2",
        world=2,
        cluster="h100-80g-ib",
    )
    fused = plan.simulate()
    eager = plan.simulate(kernels="pytorch-eager")
    assert (fused.kernels, eager.kernels) == ("fsdpc", "pytorch-eager")
    assert eager.step_time_s != fused.step_time_s
    assert "pytorch-eager kernels" in str(eager)
    # The same figures as the command's.
    assert eager.data == plan.simulate("h100-80g-ib", kernels="pytorch-eager").data
    with pytest.raises(FsdpcError, match="fsdpc, pytorch-eager"):
        plan.simulate(kernels="eager")
    with pytest.raises(TypeError, match="kernels"):
        plan.simulate(kernels=1)


def test_report_writes_the_html_page(tmp_path):
    out = mini().report(tmp_path / "r.html")
    text = open(out).read()
    assert text.lstrip().lower().startswith("<!doctype html") and "gpt-mini" in text


def test_auto_chooses_a_plan_no_slower_than_the_default():
    chosen = fsdpc.auto("gpt-mini", world=2, cluster="cpu-local")
    default = mini()
    assert chosen.step_time_s <= default.step_time_s * 1.005
    assert chosen.search is not None and chosen.search.data["chosen"] is not None
    assert len(chosen.search.candidates) > 1
    assert "chosen:" in chosen.search.text
    fixed = fsdpc.auto("gpt-mini", world=2, cluster="cpu-local", strategy="shard_grad_op", gap=0)
    assert fixed.config["strategy"] == "shard_grad_op"


def test_unknown_keywords_name_the_close_matches():
    with pytest.raises(TypeError, match="'mixed_precison'.*did you mean 'mixed_precision'"):
        mini(mixed_precison="bf16")
    with pytest.raises(TypeError, match="'shard_factr'.*'shard_factor'"):
        fsdpc.auto("gpt-mini", world=2, shard_factr=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'zzz'$"):
        mini(zzz=1)


def test_values_of_the_wrong_type_are_type_errors():
    with pytest.raises(TypeError, match="no_sync is a switch"):
        mini(no_sync="yes")
    with pytest.raises(TypeError, match="strategy takes a str"):
        mini(strategy=object())
    with pytest.raises(TypeError, match="grad_accum takes one value"):
        mini(grad_accum=[1, 2])
    with pytest.raises(TypeError, match="world is the number of ranks"):
        fsdpc.compile("gpt-mini", world="2")
    with pytest.raises(TypeError, match="world is the number of ranks"):
        fsdpc.compile("gpt-mini", world=True)
    with pytest.raises(ValueError, match="at least 1"):
        fsdpc.compile("gpt-mini", world=0)
    with pytest.raises(TypeError, match="model is a zoo spec"):
        fsdpc.compile(42, world=2)
    with pytest.raises(TypeError, match="sets 'output' itself"):
        mini(output="x.json")


def test_values_the_planner_refuses_carry_the_command_lines_message():
    with pytest.raises(FsdpcError, match="invalid strategy `zero9`"):
        mini(strategy="zero9")
    with pytest.raises(FsdpcError, match="nosuch.onnx"):
        fsdpc.compile("nosuch.onnx", world=2)
    with pytest.raises(FsdpcError, match="invalid value 'many' for '--grad-accum"):
        mini(grad_accum="many")
    with pytest.raises(FsdpcError, match="does not fit"):
        fsdpc.compile("gpt3-175b", world=8, cluster="a100-80g-roce")
    # One line, as the command line prints it.
    try:
        mini(strategy="zero9")
    except FsdpcError as e:
        assert "\n" not in str(e)


def test_flags_lists_the_keywords():
    names = {name: kind for name, kind, _ in fsdpc.flags()}
    assert names["mixed_precision"] == "value"
    assert names["no_sync"] == "switch"
    assert names["activation_checkpointing"] == "optional_value"
    assert names["freeze"] == "repeated"
    assert "output" not in names and "world" not in names


def test_the_documentation_is_in_help():
    assert "world" in fsdpc.compile.__doc__ and "mixed_precision" in fsdpc.compile.__doc__
    assert fsdpc.Plan.simulate.__doc__ and fsdpc.auto.__doc__ and fsdpc.from_torch.__doc__
    assert fsdpc.FsdpcError.__doc__


def test_the_command_is_the_binarys(tmp_path, fsdpc_command):
    version = subprocess.run([fsdpc_command, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"fsdpc {fsdpc.__version__}"
    out = tmp_path / "p.json"
    subprocess.run(
        [fsdpc_command, "compile", "gpt-mini", "--world", "2", "-o", str(out)], check=True, capture_output=True
    )
    inspect = subprocess.run([fsdpc_command, "inspect", str(out)], capture_output=True, text=True, check=True)
    assert "transformer.h.0" in inspect.stdout
    bad = subprocess.run([fsdpc_command, "compile", "gpt-mini", "--wrold", "2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--wrold" in bad.stderr
