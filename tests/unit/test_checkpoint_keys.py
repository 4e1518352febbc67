"""`parallelizer.checkpoint`'s key check before DCP's collective load (`checkpoint._check_against`): a checkpoint
whose keys differ from the model's and optimizer's is refused on every rank alike, and a difference in param-group
settings names them with its usual cause (trial r12e: an LR scheduler built after `checkpoint.load` lacked the
saved groups' `initial_lr`, and the remedy spoke only of frozen parameters)."""
from types import SimpleNamespace

import pytest

from parallelizer.checkpoint import _check_against
from parallelizer.errors import StateDictError

WANTED = {"model.w": (4, 4), "optimizer.state.w.exp_avg": (4, 4), "optimizer.param_groups.w.lr": None}


def _saved(*extra):
    return SimpleNamespace(state_dict_metadata={**{k: SimpleNamespace(size=v) for k, v in WANTED.items()},
                                                **{k: SimpleNamespace(size=None) for k in extra}})


def test_matching_keys_pass_and_a_scheduler_key_is_named_with_its_remedy():
    _check_against(WANTED, _saved(), "ckpt")
    with pytest.raises(StateDictError, match=r"param-group settings \['initial_lr'\].*build it before checkpoint.load") as e:
        _check_against(WANTED, _saved("optimizer.param_groups.w.initial_lr"), "ckpt")
    assert e.value.unexpected == ["optimizer.param_groups.w.initial_lr"] and e.value.missing == []


def test_other_key_differences_keep_the_plain_remedy():
    with pytest.raises(StateDictError, match="frozen parameter has no optimizer state\\)$") as e:
        _check_against(WANTED, _saved("optimizer.state.v.exp_avg"), "ckpt")
    assert "param-group settings" not in str(e.value)
