"""The package's layers (docs/architecture.md): no import goes up a layer, no two units import
each other. Every import statement of ``tvm_streamk`` is read, function-level ones included."""

import ast
from collections import defaultdict

from tests.helpers import ROOT

PACKAGE = ROOT / "tvm_streamk"
# docs/architecture.md's table: a unit is a module or a subpackage directly under tvm_streamk.
LAYERS = {
    0: {"_compat", "errors"},
    1: {
        "decomposition",
        "occupancy",
        "gpus",
        "fixup_registry",
        "memory_model",
        "ptxas",
        "register_estimate",
        "report",
    },
    2: {"analysis"},
    3: {"cost_model", "run_time_choice"},
    4: {"decision"},
    5: {"transform", "pipeline", "lowered_view", "resources"},
    6: {"pocl", "webgpu", "device"},
    7: {"schedule", "explain"},
    8: {
        "meta_schedule",
        "postproc",
        "dlight",
        "relax_pipeline",
        "vector_rows",
        "model_report",
        "moe",
        "workloads",
    },
    9: {"cli", "__main__", "__init__"},
}
LAYER_OF = {unit: layer for layer, units in LAYERS.items() for unit in units}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_of(path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """Unit -> the units it imports (other than itself)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        module = _module_of(path)
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if (
                    name.startswith("tvm_streamk.")
                    and (PACKAGE / name.split(".")[1]).exists()
                    or (
                        name.startswith("tvm_streamk.")
                        and (PACKAGE / f"{name.split('.')[1]}.py").exists()
                    )
                ):
                    if _unit(name) != _unit(module):
                        edges[_unit(module)].add(_unit(name))
    return edges


def test_every_unit_has_a_layer():
    units = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()
    }
    assert units == set(LAYER_OF), (units - set(LAYER_OF), set(LAYER_OF) - units)


def test_no_import_goes_up_a_layer():
    upward = [
        f"{unit} (layer {LAYER_OF[unit]}) imports {other} (layer {LAYER_OF[other]})"
        for unit, others in _imports().items()
        for other in others
        if LAYER_OF[other] > LAYER_OF[unit]
    ]
    assert not upward, upward


def test_no_two_units_import_each_other():
    edges = _imports()
    mutual = sorted(
        {tuple(sorted((a, b))) for a, bs in edges.items() for b in bs if a in edges.get(b, ())}
    )
    assert not mutual, mutual
