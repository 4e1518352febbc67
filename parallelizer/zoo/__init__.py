"""Model zoo for tests, examples and the CLI: small models with random weights, built from configs.

Every builder returns `(model, example_inputs)`; none downloads anything (HF_HUB_OFFLINE=1).
"""
from .gpt import GPT, GPTConfig, gpt
from .hf import bert, gpt2, llama, llama2_7b_config, vit
from .mlp import MLP, mlp

BUILDERS = {"mlp": mlp, "gpt": gpt, "gpt2": gpt2, "llama": llama, "bert": bert, "vit": vit}

__all__ = ["MLP", "mlp", "GPT", "GPTConfig", "gpt", "gpt2", "llama", "llama2_7b_config", "bert", "vit",
           "BUILDERS"]
