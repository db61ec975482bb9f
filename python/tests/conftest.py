"""Shared fixtures of the Python tests: the `fsdpc` command the wheel
installed, beside the interpreter running them."""

import os
import shutil
import sys

import pytest


@pytest.fixture(scope="session")
def fsdpc_command():
    """The console script of the installed wheel."""
    here = os.path.join(os.path.dirname(sys.executable), "fsdpc")
    path = here if os.path.exists(here) else shutil.which("fsdpc")
    assert path, "the fsdpc wheel's `fsdpc` command is not installed beside this Python"
    return path
