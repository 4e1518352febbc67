"""The wrapped model's methods read on a parallel module, and wrappers built by training libraries (trial r14c).

`runtime.model_attrs.missing`: a name of the model's class or root instance is a ModelAttributeError (an
AttributeError too) naming the model's class and the remedy for the module's kind; other names and private names
stay torch's plain AttributeError. `runtime.wrappers._library_hint`: a DistributedDataParallel built by
transformers' Trainer or accelerate's Accelerator.prepare (both did so for a ParallelModule and got a remedy naming
neither) adds what to do with that library; the outermost library wins (Trainer calls accelerate).
"""
import torch

from parallelizer.errors import ModelAttributeError
from parallelizer.runtime.model_attrs import missing, remember
from parallelizer.runtime.wrappers import _library_hint


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.config = {"hidden": 2}

    def save_pretrained(self, directory):
        pass

    def generate(self, ids):
        return ids


class PipelineModule(torch.nn.Module):  # named as the runtime's: the remedy depends on the kind
    pass


class ParallelModule(torch.nn.Module):
    pass


def test_model_methods_and_attributes_are_typed_with_the_remedy_of_the_kind():
    for kind, full_model in ((ParallelModule, True), (PipelineModule, False)):
        module = kind()
        remember(module, Model())
        error = missing(module, "save_pretrained")
        assert isinstance(error, ModelAttributeError) and isinstance(error, AttributeError)
        text = str(error)
        assert f"{kind.__name__}.save_pretrained" in text and "(Model)" in text, text
        assert ("pm.full_model() as m: m.save_pretrained(...)" in text) is full_model, text
        assert "model.load_state_dict(pm.full_state_dict())" in text and "export_full_state_dict" in text, text
        assert "an attribute" in str(missing(module, "config")) and "model.config" in str(missing(module, "config"))
        assert "export_full_state_dict" not in str(missing(module, "generate"))


def test_other_names_stay_plain_attribute_errors():
    module = ParallelModule()
    remember(module, Model())
    for name in ("no_such_thing", "_private", "__deepcopy__"):
        error = missing(module, name)
        assert type(error) is AttributeError and name in str(error)
    assert type(missing(ParallelModule(), "generate")) is AttributeError  # nothing recorded: built without a model


def _hint():
    return _library_hint()  # frames: _library_hint, _hint, then the library's caller


def _from(module_names):
    """Call `_hint` through functions whose module globals are `module_names`, outermost first."""
    call = _hint
    for name in reversed(module_names):
        namespace = {"__name__": name, "inner": call}
        exec("def call():\n    return inner()\n", namespace)
        call = namespace["call"]
    return call()


def test_wrappers_built_by_training_libraries_name_what_to_do():
    assert "accelerator.prepare(opt)" in _from(["accelerate.accelerator"])
    assert "Trainer" in _from(["transformers.trainer", "accelerate.accelerator"])
    assert "accelerator.prepare(opt)" not in _from(["transformers.trainer", "accelerate.accelerator"])
    assert _from(["my_script"]) == ""
    assert _from(["accelerated_scan"]) == ""  # a prefix of the name is not the library
