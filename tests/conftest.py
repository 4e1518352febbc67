"""Shared test settings: offline Hugging Face, deterministic torch, a few small fixtures."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.use_deterministic_algorithms(True, warn_only=True)
