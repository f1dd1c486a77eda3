"""Model runner: our llama-family implementation and the loaders that feed it."""

from specdec.models.config import ModelConfig
from specdec.models.context import AttentionContext
from specdec.models.llama import ForwardOutput, LlamaModel
from specdec.models.loader import LoadedModel, load_model

__all__ = ["AttentionContext", "ForwardOutput", "LlamaModel", "LoadedModel", "ModelConfig", "load_model"]
