"""`parallelizer` CLI in-process: plan -> show -> Plan.load round trip, determinism, mesh search, errors."""
import pytest
import torch

from parallelizer import cli, zoo
from parallelizer.planner import Plan

GPT = ["--model", "gpt", "--config", "n_layer=2,n_embd=32,n_head=2,vocab_size=64,block_size=16",
       "--global-batch", "4", "--no-progress"]


def tiny_factory(batch: int = 4, width: int = 16):
    """A user factory for `--model test_cli:tiny_factory` (returns (model, example_inputs))."""
    model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))
    return model, (torch.randn(batch, 8),)


def failing_factory(width: int = 16):
    """A factory that raises (`--model test_cli:failing_factory`)."""
    raise RuntimeError(f"boom at width {width}")


def kwargs_factory(device="cpu", **kwargs):
    """A factory taking **kwargs (any --config key passes the check; a bad one fails when building)."""
    with torch.device(device):
        return tiny_factory(**kwargs)


def test_plan_show_load_round_trip_and_determinism(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", *GPT, "--cluster", "h100:1x2", "--mesh", "dp=2", "-o", str(out)]) == 0
    first = out.read_bytes()
    assert cli.main(["plan", *GPT, "--cluster", "h100:1x2", "--mesh", "dp=2", "-o", str(out)]) == 0
    assert out.read_bytes() == first  # byte-identical
    capsys.readouterr()
    assert cli.main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    for title in ("## Mesh", "## Estimated step time", "## Memory per device", "## Block h.* (2 x", "## Fallbacks"):
        assert title in shown
    plan = Plan.load(out)
    assert plan.model["recipe"] == {"preset": "gpt", "builder": "gpt", "kwargs": {
        "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "block_size": 16, "batch": 4}}
    assert plan.to_json() + "\n" == first.decode()
    model, inputs = zoo.gpt(n_layer=2, n_embd=32, n_head=2, vocab_size=64, block_size=16, batch=4, device="meta")
    import parallelizer
    Plan.load(out, traced=parallelizer.trace(model, inputs), mesh={"dp": 2})  # made for this model: no error


def test_mesh_search_without_mesh_and_factory_model(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "test_cli:tiny_factory", "--config", "width=32", "--cluster", "h100:1x4",
                     "--global-batch", "8", "--no-progress", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "mesh search over 2 meshes of 4 devices" in text and "<- chosen" in text  # not (dp=1, tp=4) = (dp=4)
    assert "(dp=4)" in text and "(dp=2, tp=2)" in text and "dp=1" not in text
    assert "traced inputs: input (8, 8)" in text
    plan = Plan.load(out)
    assert plan.mesh.world_size == 4 and plan.model["recipe"]["factory"] == "test_cli:tiny_factory"
    assert plan.model["inputs"] == {"input": [8, 8]}


@pytest.mark.parametrize("argv, message", [
    (["plan", "--model", "nosuch", "--no-progress"], "unknown model 'nosuch'"),
    (["plan", *GPT, "--mesh", "dp=two"], "--mesh 'dp=two'"),
    (["plan", *GPT, "--cluster", "tpu:1x8"], "unknown cluster preset"),
    (["plan", *GPT, "--global-batch", "5", "--grad-accum", "2"], "multiple of --grad-accum"),
    (["plan", *GPT, "--global-batch", "0"], "--global-batch 0: give the number of samples"),
    (["plan", *GPT, "--roles", "dp=fsdp"], "--roles dp=fsdp: give the mesh they refer to with --mesh"),
    (["plan", *GPT, "--mesh", "dp=2", "--roles", "dp=zero3"], "axis_roles['dp']='zero3'"),
    (["plan", *GPT, "--mesh", "dp=2", "--roles", "dp=fsdp,dp=ddp"], "--roles: 'dp' is given twice"),
    (["plan", *GPT, "--mesh", "dp=2", "--roles", "dp"], "--roles: 'dp' is not KEY=VALUE (e.g. dp=fsdp,tp=tp)"),
])
def test_bad_input_exits_2_with_a_message(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_rehearse_checks_nproc_and_malformed_plan(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", *GPT, "--cluster", "h100:1x2", "--mesh", "dp=2", "-o", str(out)]) == 0
    assert cli.main(["rehearse", str(out), "--nproc", "4"]) == 2
    assert "has 2 devices but --nproc is 4" in capsys.readouterr().err
    out.write_text(out.read_text().replace('"optimal": true', '"optimal": "yes"'))
    assert cli.main(["show", str(out)]) == 2
    assert "invalid at solver/optimal" in capsys.readouterr().err


@pytest.mark.parametrize("model, config, suggestion", [
    ("gpt2", "n_layers=4", "n_layer"),  # transformers configs accept unknown kwargs silently
    ("gpt", "n_layers=1", "n_layer"),
    ("mlp", "hiden=8", "hidden"),
    ("test_cli:tiny_factory", "widht=8", "width"),
])
def test_unknown_config_key_exits_2_naming_the_closest_key(model, config, suggestion, capsys):
    argv = ["plan", "--model", model, "--config", config, "--cluster", "h100:1x4", "--no-progress"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"unknown --config key {config.split('=')[0]!r}" in err and f"did you mean {suggestion!r}" in err


def test_valid_config_keys_pass_the_check():
    from parallelizer import presets
    presets.check_config("gpt2", {"n_layer": 2, "hidden_size": 64, "seq_len": 16, "activation_function": "relu"})
    presets.check_config("gpt", {"block_size": 16, "with_targets": True})
    presets.check_config("test_cli:kwargs_factory", {"anything": 1})
    with pytest.raises(presets.UnknownConfigKeyError):
        presets.check_config("gpt2", {"to_dict": 1})  # a method, not a config field


@pytest.mark.parametrize("model, config, cause", [
    ("gpt2", "n_layer=four", "StrictDataclassFieldValidationError"),
    ("test_cli:failing_factory", "width=8", "RuntimeError: boom at width 8"),
    ("test_cli:kwargs_factory", "depth=2", "TypeError: tiny_factory() got an unexpected keyword argument 'depth'"),
])
def test_model_build_failure_is_one_typed_line(model, config, cause, capsys):
    argv = ["plan", "--model", model, "--config", config, "--cluster", "h100:1x2", "--no-progress"]
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-2].startswith(f"error: building model {model} with config {{") and cause in lines[-2]
    assert lines[-1].startswith("Remedy:")


def test_mesh_contradicting_cluster_and_broken_pipe(tmp_path, capsys, monkeypatch):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", *GPT, "--cluster", "h100:1x2", "--mesh", "dp=2", "-o", str(out)]) == 0

    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    with monkeypatch.context() as m:  # `parallelizer show plan.json | head`: no traceback
        m.setattr("sys.stdout", ClosedPipe())
        assert cli.main(["show", str(out)]) == 141
    capsys.readouterr()
    out.write_text(out.read_text().replace('"devices_per_node": 2', '"devices_per_node": 4'))
    for argv in (["show", str(out)], ["rehearse", str(out), "--nproc", "2"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "has 2 devices" in err and "has 4" in err


def test_parse_helpers():
    assert cli.parse_kv("n_layer=24,bias=false,name=x", "--config") == {"n_layer": 24, "bias": False, "name": "x"}
    assert cli.parse_mesh("dp=4,tp=2").shape == (4, 2)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        cli.parse_kv("n_layer", "--config")


def test_roles_force_the_kind_of_a_planned_axis(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", *GPT, "--cluster", "h100:1x2", "--mesh", "dp=2", "--roles", "dp=fsdp",
                     "-o", str(out)]) == 0
    plan = Plan.load(out)
    assert plan.config["axis_roles"] == [["dp", "fsdp"]]
    capsys.readouterr()
    assert cli.main(["show", str(out)]) == 0 and "axis roles" in capsys.readouterr().out
    matrices = [q for q in plan.params.values() if len(q.shape) == 2]
    assert matrices and all(q.stored.startswith("S(") for q in matrices)


@pytest.mark.distributed
def test_rehearse_reduced_width_on_two_ranks(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "mlp", "--config", "dim=256,hidden=1024", "--global-batch", "64",
                     "--cluster", "h100:1x2", "--mesh", "dp=2", "--no-progress", "-o", str(out)]) == 0
    assert cli.main(["rehearse", str(out), "--nproc", "2", "--width", "reduced", "--timeout", "120"]) == 0
    text = capsys.readouterr().out
    assert "reduced width" in text and "numerics match on 2 ranks" in text
