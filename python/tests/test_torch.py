"""`fsdpc.from_torch` and `fsdpc.torch.apply`: a torch module planned
through the exporter, and the plan applied to PyTorch FSDP2 on 2 CPU
processes (gloo, under torchrun), trained against the unwrapped module.

torch is optional for fsdpc: without it these tests skip, unless
FSDPC_REQUIRE_TORCH is set (CI sets it)."""

import json
import os
import subprocess
import sys

import pytest

if os.environ.get("FSDPC_REQUIRE_TORCH"):
    import torch
else:
    torch = pytest.importorskip("torch", reason="torch is not installed (optional for fsdpc)")

import fsdpc
from fsdpc import ExportError

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tiny import Tiny, cross_entropy  # noqa: E402


def plan_tiny(**flags):
    torch.manual_seed(0)
    model = Tiny()
    ids = torch.zeros(2, 8, dtype=torch.long)
    return model, fsdpc.from_torch(model, (ids,), world=2, cluster="cpu-local", **flags)


def test_from_torch_keeps_the_modules_parameter_names():
    model, plan = plan_tiny(loss="cross_entropy")
    names = sorted(p for u in plan.units for p in u.params)
    assert names == sorted(n for n, _ in model.named_parameters())
    assert [u.module for u in plan.units] == ["", "blocks.0", "blocks.1", "blocks.2"]
    assert plan.units[1].kind == "Block"
    assert sum(u.numel for u in plan.units) == sum(p.numel() for p in model.parameters())
    assert plan.timings["export_s"] > 0 and plan.timings["plan_s"] > 0


def test_a_loss_function_is_exported_with_the_module():
    torch.manual_seed(0)
    model = Tiny()
    ids = torch.zeros(2, 8, dtype=torch.long)
    plan = fsdpc.from_torch(model, (ids,), cross_entropy, targets=(ids,), world=2, cluster="cpu-local")
    assert sorted(p for u in plan.units for p in u.params) == sorted(n for n, _ in model.named_parameters())
    assert plan.module_prefix == ""


def test_the_exporter_s_file_is_kept_where_asked(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "tiny.onnx"
    fsdpc.from_torch(Tiny(), (torch.zeros(2, 8, dtype=torch.long),), "cross_entropy", world=2, path=path)
    again = fsdpc.compile(path, world=2, loss="cross_entropy")
    assert len(again.units) == 4


def test_a_module_that_does_not_export_is_one_short_error():
    with pytest.raises(ExportError) as e:
        fsdpc.from_torch(Tiny(), (torch.randn(2, 8),), loss="cross_entropy", world=2)
    message = str(e.value)
    assert message.startswith("the module did not export (dynamo exporter): ")
    assert "\n" not in message and "\x1b" not in message and len(message) < 400
    assert isinstance(e.value, fsdpc.FsdpcError)


def test_from_torch_refuses_wrong_types():
    ids = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        fsdpc.from_torch("Tiny", (ids,), world=2)
    with pytest.raises(TypeError, match="example_inputs are tensors"):
        fsdpc.from_torch(Tiny(), ([1, 2],), world=2)
    with pytest.raises(TypeError, match="needs its targets"):
        fsdpc.from_torch(Tiny(), (ids,), cross_entropy, world=2)
    with pytest.raises(ValueError, match="exporter is"):
        fsdpc.from_torch(Tiny(), (ids,), "cross_entropy", world=2, exporter="jit")
    with pytest.raises(TypeError, match="mixed_precision"):
        fsdpc.from_torch(Tiny(), (ids,), "cross_entropy", world=2, mixed_precison="bf16")


def test_apply_needs_a_process_group_of_the_plans_world():
    model, plan = plan_tiny(loss="cross_entropy")
    with pytest.raises(ValueError, match="no process group"):
        fsdpc.torch.apply(model, plan)
    with pytest.raises(TypeError, match="fsdpc.Plan"):
        fsdpc.torch.apply(model, plan.to_json())


def test_prefetch_lists_follow_the_schedule():
    _, plan = plan_tiny(loss="cross_entropy", prefetch_depth=2)
    forward, backward = fsdpc.torch.prefetch_lists(plan)
    assert forward == {1: [2, 3], 2: [3], 3: []}
    assert backward == {3: [2, 1], 2: [1], 1: []}
    _, none = plan_tiny(loss="cross_entropy", forward_prefetch=False)
    assert all(v == [] for v in fsdpc.torch.prefetch_lists(none)[0].values())


def torchrun(script, *args, ranks):
    """`script` from this directory on `ranks` gloo processes; its run."""
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
         os.path.join(HERE, script), *args],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return run


def run_fsdp2(tmp_path, *flags, ranks=2):
    out = tmp_path / "run.json"
    torchrun("fsdp2_worker.py", str(out), *flags, ranks=ranks)
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "ranks,flags",
    [
        (2, ("activation_checkpointing=true",)),
        (2, ("strategy=shard_grad_op", "prefetch_depth=2")),
        (2, ("reshard_after_forward=" + json.dumps({"blocks.1": False}), "wrap=kind:Block")),
        (4, ("strategy=hybrid_shard", "shard_factor=2")),
    ],
    ids=["full_shard+checkpointing", "shard_grad_op+depth2", "per-unit-reshard", "hybrid-4-ranks"],
)
def test_fsdp2_trains_as_the_unwrapped_module(tmp_path, ranks, flags):
    r = run_fsdp2(tmp_path, *flags, ranks=ranks)
    # Two ranks' mean of their halves' losses against the whole batch's
    # loss: the reduction order differs, so float tolerance.
    for got, want in zip(r["losses"], r["reference"]):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert r["param_diff"] < 1e-5
    # The names map both ways: every plan parameter is a module parameter
    # and every module parameter is in the plan.
    assert r["plan_params"] == r["mapped"] == r["torch_params"]
    units = {u["path"]: u for u in r["units"]}
    assert set(units) == {"", "blocks.0", "blocks.1", "blocks.2"}
    assert all(u["fsdp"] for u in units.values())
    assert units[""]["reshard"] is False
    if "activation_checkpointing=true" in flags:
        assert all(units[f"blocks.{i}"]["checkpointed"] for i in range(3))
        assert units["blocks.0"]["forward_prefetch"] == ["blocks.1"]
        assert units["blocks.2"]["backward_prefetch"] == ["blocks.1"]
    if "strategy=shard_grad_op" in flags:
        assert all(units[f"blocks.{i}"]["reshard"] is False for i in range(3))
        assert units["blocks.0"]["forward_prefetch"] == ["blocks.1", "blocks.2"]
        # Nothing to prefetch in backward: every unit kept its parameters.
        assert all(u["backward_prefetch"] == [] for u in units.values())
    if any(f.startswith("reshard_after_forward") for f in flags):
        assert units["blocks.1"]["reshard"] is False and units["blocks.0"]["reshard"] is True
    if "strategy=hybrid_shard" in flags:
        # Sharded over pairs, replicated across them: a (2, 2) mesh.
        assert r["mesh"] == [2, 2]


def test_precision_and_offload_reach_fully_shard():
    run = torchrun("fsdp2_policies.py", ranks=1)
    r = json.loads(run.stdout.strip().splitlines()[-1])
    assert r["param_dtype"] == "torch.bfloat16" and r["reduce_dtype"] == "torch.float32"
    assert r["output_dtype"] == "torch.bfloat16"
    # The f32 master parameters keep f32 gradients, as the plan's shards do.
    assert r["grad_dtype"] == "torch.float32"
    assert all(r["offloaded"])
    assert any(n.startswith("buffer_dtype bf16") for n in r["notes"])
