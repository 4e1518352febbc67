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
