"""Records the parameter names and shapes PyTorch reports for the models of
tests/fixtures/onnx/ in tests/fixtures/torch/param_names.json, which
tests/it/onnx_names.rs compares fsdpc's imported parameters with: per model,
`params` (`named_parameters()` of the exported module: a tied weight once,
under its first name) and `tied` (every other name of a tied weight, as
`state_dict()` also lists it, with its first name). An exporter may keep a
tied weight under any of its names.

Builds the models with scripts/export_fixtures.py's own builders; run it with
the virtualenv scripts/export-fixtures.sh makes:

    /work/venv-torch/bin/python scripts/torch_param_names.py
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import export_fixtures as ef  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "torch", "param_names.json")


def main():
    out = {}
    for model in ("nanogpt", "gpt2", "llama", "bert"):
        fx = ef.Fixture(f"{model}_names", model, "dynamo")
        module, _, _ = ef.build(fx)
        params = {name: list(p.shape) for name, p in module.named_parameters()}
        first = {id(p): name for name, p in module.named_parameters()}
        tied = {
            name: first[id(p)]
            for name, p in module.named_parameters(remove_duplicate=False)
            if name not in params
        }
        out[model] = {"params": params, "tied": tied}
    # One parameter a line, so that a diff shows which one changed.
    models = []
    for model, rec in sorted(out.items()):
        parts = []
        for key in ("params", "tied"):
            lines = [f"   {json.dumps(n)}: {json.dumps(v)}" for n, v in sorted(rec[key].items())]
            body = "{\n" + ",\n".join(lines) + "\n  }" if lines else "{}"
            parts.append(f"  {json.dumps(key)}: {body}")
        models.append(f" {json.dumps(model)}: {{\n" + ",\n".join(parts) + "\n }")
    with open(OUT, "w") as f:
        f.write("{\n" + ",\n".join(models) + "\n}\n")
    print(f"wrote {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
