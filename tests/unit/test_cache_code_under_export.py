"""A transformers model whose default `use_cache=True` runs cache code that torch.export cannot follow (round 21,
r21e): Dory copies its recurrent layers' cache layers in forward (`copy.deepcopy`, modeling_dory.py), export
raises "Cannot access data pointer of Tensor" in copy.py, and the TraceError named copy.py:153 with a remedy about
paths taken under export. Now it names the cache line and `use_cache=False` (rule 10), and that remedy traces a
program whose loss equals the eager model's."""
import pytest
import torch

import parallelizer
from parallelizer.errors import TraceError

transformers = pytest.importorskip("transformers")


def _dory(use_cache: bool):
    config = transformers.AutoConfig.for_model(
        "dory", hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
        vocab_size=64, max_position_embeddings=64, num_hidden_layers=4, n_input_layers=1, n_output_layers=1,
        use_cache=use_cache, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.DoryForCausalLM._from_config(config, attn_implementation="eager").train()
    ids = torch.randint(3, 60, (2, 8), generator=torch.Generator().manual_seed(1))
    return model, (ids,), {"labels": ids}


def test_cache_code_export_cannot_follow_names_use_cache_false_and_the_remedy_traces():
    with pytest.raises(TraceError) as caught:
        parallelizer.trace(*_dory(use_cache=True))
    text = str(caught.value)
    assert "use_cache=False" in text and "modeling_dory.py" in text and "deepcopy" in text, text
    model, args, kwargs = _dory(use_cache=False)
    eager = model(*args, **kwargs).loss
    got = parallelizer.trace(model, args, kwargs).exported.module()(*args, **kwargs)
    torch.testing.assert_close(got.loss if hasattr(got, "loss") else got[0], eager)
