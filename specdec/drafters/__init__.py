"""Drafters: proposers of token trees, registered by name and built from spec strings."""

from specdec.drafters.base import Drafter, DrafterContext
from specdec.drafters.registry import available, build_drafter, register

__all__ = ["Drafter", "DrafterContext", "available", "build_drafter", "register"]
