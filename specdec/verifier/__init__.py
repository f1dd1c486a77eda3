"""Tree verification: acceptance rules that never know which drafter made the tree."""

from specdec.verifier.result import VerifyResult
from specdec.verifier.rules import verify_greedy, verify_greedy_batch, verify_stochastic

__all__ = ["VerifyResult", "verify_greedy", "verify_greedy_batch", "verify_stochastic"]
