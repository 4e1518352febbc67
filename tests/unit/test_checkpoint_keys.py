"""`parallelizer.checkpoint`'s key check before DCP's collective load (`checkpoint._check_against`): a checkpoint
whose keys differ from the model's and optimizer's is refused on every rank alike; param-group settings are taken
from the checkpoint as torch's `Optimizer.load_state_dict` takes them (`checkpoint._group_settings`: trial r12e's
LR scheduler built after `checkpoint.load` lacked the saved groups' `initial_lr`, and the load refused it)."""
from types import SimpleNamespace

import pytest

from parallelizer.checkpoint import _check_against, _group_settings
from parallelizer.errors import StateDictError

WANTED = {"model.w": (4, 4), "optimizer.state.w.exp_avg": (4, 4), "optimizer.param_groups.w.lr": None}


def _saved(*extra, without=()):
    return SimpleNamespace(state_dict_metadata={**{k: SimpleNamespace(size=v) for k, v in WANTED.items()
                                                   if k not in without},
                                                **{k: SimpleNamespace(size=None) for k in extra}})


def test_matching_keys_pass_and_others_are_refused_with_both_lists():
    _check_against(WANTED, _saved(), "ckpt")
    with pytest.raises(StateDictError, match="frozen parameter has no optimizer state\\)$") as e:
        _check_against(WANTED, _saved("optimizer.state.v.exp_avg"), "ckpt")
    assert e.value.unexpected == ["optimizer.state.v.exp_avg"] and e.value.missing == []


def test_param_group_settings_follow_the_checkpoint_as_torch_loads_them():
    """A setting only the checkpoint has (a scheduler's initial_lr, saved with the scheduler) is loaded and added;
    one only this optimizer has (its scheduler built before loading a checkpoint saved without one) is kept; a
    parameter this optimizer does not hold adds nothing (the model keys then differ and are refused)."""
    osd = {"state.w.exp_avg": 0, "param_groups.w.lr": 1e-3, "param_groups.w.initial_lr": 1e-2}
    kept, added = _group_settings(osd, _saved("optimizer.param_groups.w.weight_decay",
                                              "optimizer.param_groups.v.initial_lr"))
    assert kept == {"param_groups.w.initial_lr": 1e-2} and added == {"param_groups.w.weight_decay": None}
    kept, added = _group_settings({"state.w.exp_avg": 0, "param_groups.w.lr": 1e-3},
                                  _saved("optimizer.param_groups.w.initial_lr"))
    assert kept == {} and added == {"param_groups.w.initial_lr": None}


def test_a_checkpoint_missing_its_metadata_or_a_data_file_is_named_before_any_read(tmp_path):
    """Trial r14e: a checkpoint whose save was interrupted (no `.metadata`, which DCP writes last) or one of whose
    rank files this rank cannot see (node-local disks, resuming on another mesh) failed with DCP's raw
    FileNotFoundError mid-load; now a typed CheckpointFilesError (still a FileNotFoundError) names the files and
    the remedy, before anything is read."""
    import shutil

    import torch

    import parallelizer
    from parallelizer import checkpoint, zoo
    from parallelizer.errors import CheckpointFilesError

    torch.manual_seed(0)
    model, inputs = zoo.mlp(depth=1, batch=4, dim=8, hidden=16, in_features=4)
    pm = parallelizer.auto_parallelize(model, inputs, mesh={"dp": 1})
    opt = torch.optim.AdamW(pm.parameters())
    pm(*inputs).sum().backward()
    opt.step()
    checkpoint.save(pm, opt, tmp_path / "ok")
    checkpoint.load(pm, opt, tmp_path / "ok")  # complete: loads
    for removed in (".metadata", "__0_0.distcp"):
        broken = tmp_path / removed.strip("._")
        shutil.copytree(tmp_path / "ok", broken)
        (broken / removed).unlink()
        with pytest.raises(CheckpointFilesError, match="Remedy: ") as e:
            checkpoint.load(pm, opt, broken)
        assert e.value.missing == [removed] and isinstance(e.value, FileNotFoundError), e.value
        assert ("interrupted" in str(e.value)) and removed in str(e.value), e.value
