"""The documentation's Python examples run: every `python` block of
docs/python.md in order in one namespace, each `python torchrun` block as
a script on 2 gloo processes (those need torch), and the `python` blocks
of README.md and python/README.md."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PAGE = os.path.join(ROOT, "docs", "python.md")


def blocks(tag, page=PAGE):
    text = open(page, encoding="utf-8").read()
    return re.findall(r"^```" + re.escape(tag) + r"\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_python_blocks_run(tmp_path, monkeypatch):
    found = blocks("python")
    assert len(found) >= 3
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for code in found:
        exec(compile(code, PAGE, "exec"), namespace)


def test_the_errors_the_page_shows_are_the_ones_raised(capsys):
    code = blocks("python")[2]
    exec(compile(code, PAGE, "exec"), {})
    printed = capsys.readouterr().out.strip()
    text = open(PAGE, encoding="utf-8").read()
    shown = text.split(code, 1)[1].split("```text\n", 1)[1].split("```", 1)[0].strip()
    assert printed == shown


def test_the_torchrun_example_runs(tmp_path):
    if not os.environ.get("FSDPC_REQUIRE_TORCH"):
        pytest.importorskip("torch", reason="torch is not installed (optional for fsdpc)")
    (script,) = blocks("python torchrun")
    path = tmp_path / "train.py"
    path.write_text(script)
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(path)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "('blocks.0', True, True, ['blocks.1'])" in run.stdout


@pytest.mark.parametrize("page", ["README.md", os.path.join("python", "README.md")])
def test_the_readmes_python_blocks_run(page, tmp_path, monkeypatch):
    found = blocks("python", os.path.join(ROOT, page))
    assert found, f"{page} has no python block"
    monkeypatch.chdir(tmp_path)
    for code in found:
        exec(compile(code, page, "exec"), {})
