"""`parallelizer` CLI in-process: plan -> show -> Plan.load round trip, determinism, mesh search, errors."""
import unittest.mock

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


class _WithLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 4)

    def forward(self, x, labels=None, reduction="mean"):
        logits = self.net(x)
        return torch.nn.functional.cross_entropy(logits, labels, reduction=reduction), logits


def labels_factory(batch: int = 4):
    """A factory returning keyword inputs too: (model, args, kwargs) with labels= and a string option."""
    x, labels = torch.randn(batch, 8), torch.randint(0, 4, (batch,))
    return _WithLoss(), (x,), {"labels": labels, "reduction": "mean"}


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
        "with_targets": True, "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "block_size": 16,
        "batch": 4}}
    assert plan.to_json() + "\n" == first.decode()
    model, inputs = zoo.gpt(n_layer=2, n_embd=32, n_head=2, vocab_size=64, block_size=16, batch=4, device="meta",
                            with_targets=True)
    import parallelizer
    Plan.load(out, traced=parallelizer.trace(model, inputs), mesh={"dp": 2})  # made for this model: no error


def test_mesh_search_without_mesh_and_factory_model(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "test_cli:tiny_factory", "--config", "width=32", "--cluster", "h100:1x4",
                     "--global-batch", "8", "--no-progress", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    # no repeated blocks: pp=1, the ILP on (dp=4) and (dp=2, tp=2); not (dp=1, tp=4) = (dp=4)
    assert "searched: 2 candidates: 2 priced" in text and "chosen: (pp=1, dp=" in text
    assert "traced inputs: input_1 (8, 8)" in text  # forward(self, input): fx's name for a builtin's
    plan = Plan.load(out)
    assert plan.mesh.world_size == 4 and plan.model["recipe"]["factory"] == "test_cli:tiny_factory"
    assert plan.model["inputs"] == {"input_1": [8, 8]}


@pytest.mark.parametrize("argv, message", [
    (["plan", "--model", "nosuch", "--no-progress"], "unknown model 'nosuch'"),
    (["plan", *GPT, "--mesh", "dp=two"], "--mesh 'dp=two'"),
    (["plan", *GPT, "--cluster", "tpu:1x8"], "unknown cluster preset"),
    (["plan", *GPT, "--global-batch", "5", "--grad-accum", "2"], "multiple of --grad-accum"),
    (["plan", *GPT, "--global-batch", "0"], "--global-batch 0: give the number of samples"),
    (["plan", *GPT, "--mesh", "pp=2", "--global-batch", "7", "--microbatches", "2"],
     "--global-batch 7 must be a multiple of --microbatches 2 (the model is traced with one microbatch). Remedy"),
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


def test_a_config_alias_the_config_class_maps_to_another_field_passes():
    """Llama 3's config.json key `rope_theta`: transformers 5 stores it in `rope_parameters`, so it is no attribute
    of the default config; it was refused as an unknown key, with no way to set Llama 3's rotary base."""
    from parallelizer import presets
    presets.check_config("llama", {"rope_theta": 500000.0})
    built = presets.build(presets.recipe("llama", {"rope_theta": 500000.0, "num_hidden_layers": 1, "hidden_size": 64,
                                                   "intermediate_size": 128, "num_attention_heads": 4,
                                                   "vocab_size": 128}, batch=1, seq_len=8))
    assert built[0].config.rope_parameters["rope_theta"] == 500000.0
    with pytest.raises(presets.UnknownConfigKeyError, match="rope_thetta"):
        presets.check_config("llama", {"rope_thetta": 500000.0})  # a typo only adds itself: still refused


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


def test_pipeline_mesh_with_an_odd_global_batch_lets_the_search_choose_microbatches(tmp_path):
    """`--mesh pp=2 --global-batch 7` without --microbatches was refused as "a multiple of --grad-accum 1 x
    --microbatches 2", flags the user never gave; the search chooses 7 microbatches of 1."""
    out = tmp_path / "plan.json"
    assert cli.main(["plan", *GPT, "--mesh", "pp=2", "--global-batch", "7", "-o", str(out)]) == 0
    plan = Plan.load(out)
    assert (plan.pipeline.pp, plan.pipeline.microbatches) == (2, 7)


class _ClassWeighted(torch.nn.Module):
    """Four identical blocks and a class-weighted cross-entropy as the model's own loss."""

    def __init__(self, vocab: int = 16, dim: int = 16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.ReLU())
                                          for _ in range(4))
        self.head = torch.nn.Linear(dim, vocab)
        self.register_buffer("class_weight", torch.linspace(0.5, 2.0, vocab))

    def forward(self, ids, labels):
        h = self.emb(ids)
        for block in self.blocks:
            h = h + block(h)
        return torch.nn.functional.cross_entropy(self.head(h).flatten(0, 1), labels.flatten(),
                                                 weight=self.class_weight)


def class_weighted(batch: int = 8):
    ids = torch.randint(0, 16, (batch, 6), generator=torch.Generator().manual_seed(0))
    return _ClassWeighted(), (ids, ids.roll(1, 1))


def test_pipeline_plan_of_an_unweighable_own_loss_says_so_and_rehearse_refuses_before_ranks(tmp_path, capsys):
    """A class-weighted cross-entropy's mean divides by the sum of the targets' weights, which the pipeline cannot
    read per microbatch: `plan` notes it, and `rehearse` (which cannot pass target= / item_count=) refuses up
    front with the remedy for one's own loop; it used to fail on every rank with a remedy it could not take."""
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "test_cli:class_weighted", "--mesh", "pp=2", "--global-batch", "8",
                     "--no-progress", "-o", str(out)]) == 0
    assert "note: pm.step(loss_fn=None) and `parallelizer rehearse` cannot weigh" in capsys.readouterr().out
    assert cli.main(["rehearse", str(out), "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert "cross-entropy with class weights" in err and "cannot pass target= / item_count=" in err


def test_parse_helpers():
    assert cli.parse_kv("n_layer=24,bias=false,name=x", "--config") == {"n_layer": 24, "bias": False, "name": "x"}
    # Python spellings are typed too: "False" used to arrive as the (truthy) string "False"
    assert cli.parse_kv("use_cache=False,rope_scaling=None,eps=1e-5,act='gelu',roles=ddp", "--config") == {
        "use_cache": False, "rope_scaling": None, "eps": 1e-5, "act": "gelu", "roles": "ddp"}
    # lists, tuples and dicts keep their commas ("'2]' is not KEY=VALUE" before)
    assert cli.parse_kv("l=[1,2],t=(3,4),d={'a': 1, 'b': [5,6]},s='x,y',n=7", "--config") == {
        "l": [1, 2], "t": (3, 4), "d": {"a": 1, "b": [5, 6]}, "s": "x,y", "n": 7}
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
    # --timeout is a hang guard (17 s here at load 16), not a speed target: room for a loaded machine's start-up
    assert cli.main(["rehearse", str(out), "--nproc", "2", "--width", "reduced", "--timeout", "300"]) == 0
    text = capsys.readouterr().out
    assert "reduced width" in text and "numerics match on 2 ranks" in text
    # this small MLP's plan replicates everything on h100 prices: the match is said not to show any sharding
    assert any(n.startswith("no parallelism") for n in Plan.load(out).notes())
    assert "note: the plan shards nothing, so this match compares one device's work" in text


def test_mesh_without_cluster_is_sized_like_the_python_api(tmp_path):
    """Issue 12 item 12: `plan --mesh dp=2` without --cluster priced on DGX H100 nodes holding the mesh (the rule
    of `planner.api.resolve_cluster`), not rejected against an 8-device default."""
    from parallelizer.planner.api import default_cluster, resolve_cluster

    out = tmp_path / "plan.json"
    assert cli.main(["plan", *GPT, "--mesh", "dp=2", "-o", str(out)]) == 0
    plan = Plan.load(out)
    assert plan.cluster["spec"] == "h100:1x2" == resolve_cluster(None, 2)[1]
    assert (plan.cluster["num_nodes"], plan.cluster["devices_per_node"]) == (1, 2)
    assert {n: default_cluster(n)[1] for n in (1, 8, 12, 16, 30, 31)} == {
        1: "h100:1x1", 8: "h100:1x8", 12: "h100:2x6", 16: "h100:2x8", 30: "h100:5x6", 31: "h100:31x1"}


def test_thirty_devices_with_the_default_cluster_plan():
    """Issue 12 item 12: 30 devices were rounded to 4 x 8 = 32 and then rejected."""
    import parallelizer

    traced = parallelizer.trace(*zoo.mlp(batch=30, in_features=8, dim=16, hidden=32, out_features=4))
    plan = parallelizer.plan(traced, {"dp": 30})
    assert plan.mesh.world_size == 30 and plan.cluster["num_nodes"] * plan.cluster["devices_per_node"] == 30


def test_factory_may_return_keyword_inputs(tmp_path, capsys):
    """Issue 12 item 12: a `package.module:factory` returning (model, args, kwargs), e.g. labels=."""
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "test_cli:labels_factory", "--mesh", "dp=2", "--no-progress",
                     "-o", str(out)]) == 0
    assert "traced inputs: x (4, 8), labels (4,)" in capsys.readouterr().out
    plan = Plan.load(out)
    assert plan.model["inputs"] == {"x": [4, 8], "labels": [4]}
    assert plan.fingerprint["summary"]["constants"] == {"reduction": "'mean'"}


def test_every_option_has_help_and_shows_its_default():
    """Issue 12 item 15: `show PLAN`, `--optimizer`, `calibrate -o`, `--nprocs` had no help; `--timeout` hid its
    default."""
    parser = cli._parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in commands.items():
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"parallelizer {name} {action.option_strings or action.dest} has no help"
    rehearse = {a.dest: a for a in commands["rehearse"]._actions}
    assert "default 900" in rehearse["timeout"].help
    assert "default" in {a.dest: a for a in commands["calibrate"]._actions}["nprocs"].help


def test_show_points_to_the_architecture_notes(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", *GPT, "--mesh", "dp=2", "-o", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "S(d) = sharded along tensor dim d" in shown and "docs/architecture.md" in shown


def _cpu_profile(path):
    import json
    path.write_text(json.dumps({
        "format_version": 2, "torch_version": torch.__version__, "num_threads": 1,
        "device": {"name": "cpu", "peak_flops_per_s": {"float32": 1e11}, "hbm_bytes": 10**10,
                   "hbm_bytes_per_s": 1e10, "matmul_efficiency": 1.0, "memory_efficiency": 1.0,
                   "launch_overhead_s": 3e-6},
        "links": {"2": {"name": "gloo_x2", "latency_s": 1e-5, "bandwidth_bytes_per_s": 1e9}}, "measurements": {}}))
    return str(path)


def test_default_precision_follows_the_cluster_kind(tmp_path, capsys):
    """bf16 on a GPU preset (with the default reserve), fp32 on a calibration profile of a CPU machine (no
    reserve); --precision and --memory-reserve-gb override, and `show` prints precision and memory by kind."""
    out = tmp_path / "plan.json"
    assert cli.main(["plan", *GPT, "--cluster", "h100:1x2", "--mesh", "dp=2", "-o", str(out)]) == 0
    assert (Plan.load(out).config["precision"], Plan.load(out).config["memory_reserve_bytes"]) == ("bf16", 9 * 10**9)
    profile = _cpu_profile(tmp_path / "cpu.json")
    assert cli.main(["plan", *GPT, "--cluster", profile, "--mesh", "dp=2", "-o", str(out)]) == 0
    assert (Plan.load(out).config["precision"], Plan.load(out).config["memory_reserve_bytes"]) == ("fp32", 0)
    assert cli.main(["plan", *GPT, "--cluster", profile, "--mesh", "dp=2", "--precision", "bf16", "-o", str(out)]) == 2
    assert "no bf16 peak" in capsys.readouterr().err
    assert cli.main(["plan", *GPT, "--cluster", "h100:1x2", "--mesh", "dp=2", "--precision", "fp32",
                     "--memory-reserve-gb", "2", "-o", str(out)]) == 0
    plan = Plan.load(out)
    assert (plan.config["precision"], plan.cost.memory_bytes["reserve"]) == ("fp32", 2 * 10**9)
    capsys.readouterr()
    assert cli.main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "precision  fp32" in shown
    for kind in ("params", "grads", "optimizer", "activations", "reserve", "budget"):
        assert f"\n{kind} " in shown


def test_mesh_errors_name_the_flag_and_start_their_own_line(tmp_path, capsys):
    """Round 13 (r13d): `--mesh dp=0` printed "error: --MeshSpec declared shape=(0,)...", and an error raised while
    the progress bar was open was printed after it on the same line ("solve (foo=2):  67%|...| error: ...")."""
    assert cli.main(["plan", "--model", "mlp", "--mesh", "dp=0", "-o", str(tmp_path / "p.json")]) == 2
    assert "error: --mesh 'dp=0': MeshSpec declared shape=(0,)" in capsys.readouterr().err
    argv = ["plan", "--model", "mlp", "--mesh", "foo=2", "--roles", "dp=ddp", "-o", str(tmp_path / "p.json")]
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert any(line.startswith("error: axis_roles names mesh axis 'dp', but mesh (foo=2)") for line in lines), lines


@pytest.mark.parametrize("argv, message", [
    (["rehearse", "plan.json", "--nproc", "2", "--steps", "0"], "argument --steps: must be an integer >= 1, got 0"),
    (["rehearse", "plan.json", "--nproc", "0"], "argument --nproc: must be an integer >= 1, got 0"),
    (["rehearse", "plan.json", "--nproc", "2", "--timeout", "0"], "argument --timeout: must be > 0, got 0"),
    (["plan", *GPT, "--microbatches", "0"], "argument --microbatches: must be an integer >= 1, got 0"),
    (["plan", *GPT, "--virtual-stages", "-1"], "argument --virtual-stages: must be an integer >= 1, got -1"),
    (["plan", *GPT, "--seq-len", "0"], "argument --seq-len: must be an integer >= 1, got 0"),
    (["plan", *GPT, "--memory-budget-gb", "0"], "argument --memory-budget-gb: must be > 0, got 0"),
    (["plan", *GPT, "--memory-reserve-gb", "-2"], "argument --memory-reserve-gb: must be >= 0, got -2"),
    (["plan", *GPT, "--time-limit", "x"], "argument --time-limit: 'x' is not a number"),
    (["calibrate", "-o", "p.json", "--nprocs", "2", "0"], "argument --nprocs: must be an integer >= 1, got 0"),
])
def test_counts_and_amounts_out_of_range_exit_2_before_any_work(argv, message, capsys):
    """A 0 for --steps ran a rehearsal that compared nothing and said "numerics match" (round 16 new-user trial)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("mesh, cluster, remedy", [
    ("dp=4", "h100:1x8", "a cluster of 1x4 (CLI: --cluster PRESET:1x4, e.g. h100:1x4"),
    ("dp=16", "h100:1x8", "a cluster of 2x8 (CLI: --cluster PRESET:2x8"),
    ("dp=12", "h100:1x8", "no whole number of its nodes holds that many"),
    # with a "pp" axis the cluster was resized silently (round 17 new-user trial: pp=2,dp=4 on h100:1x4 priced on
    # 2 x 4 devices and labelled h100:1x4); now the same refusal, before tracing
    ("pp=2,dp=4", "h100:1x4", "a cluster of 2x4 (CLI: --cluster PRESET:2x4"),
    ("pp=2,dp=2", "h100:1x8", "a cluster of 1x4 (CLI: --cluster PRESET:1x4"),
    ("pp=3,dp=2", "h100:1x4", "has 6 devices but the cluster has 1 nodes x 4 = 4"),
])
def test_a_mesh_of_fewer_devices_than_the_cluster_names_the_cli_remedy(mesh, cluster, remedy, tmp_path, capsys):
    """The mesh / cluster mismatch told a CLI user to "build a smaller Cluster" (round 16 new-user trial)."""
    with unittest.mock.patch("parallelizer.tracer.trace", side_effect=AssertionError("traced before the check")):
        assert cli.main(["plan", *GPT, "--mesh", mesh, "--cluster", cluster, "-o", str(tmp_path / "p.json")]) == 2
    assert remedy in capsys.readouterr().err


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    # round 25 new-user trial: Ctrl-C during `parallelizer rehearse` printed the interpreter's traceback of the
    # multiprocessing wait it interrupted (the ranks stopped: the terminal's SIGINT reaches the process group)
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "cmd_show", interrupted)
    assert cli.main(["show", "plan.json"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted: parallelizer show stopped (Ctrl-C)" and "Traceback" not in err
