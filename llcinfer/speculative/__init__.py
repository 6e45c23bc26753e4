"""Speculative decoding: drafters propose token trees, a budget decides which nodes of
which sequences one verification step takes (the engine runs and accepts them).

    tree.py          DraftTree, the lossless acceptance walk
    lookup.py        NgramDrafter (prompt lookup), SuffixDrafter (history of all requests)
    draft_model.py   DraftModelDrafter (a smaller model of the same vocabulary)
    acceptance.py    Acceptance: the drafts' measured worth, which scales their confidences
    pacer.py         Pacer: drafting paused while speculation has cost more than it gained
    budget.py        Gates, select_super_tree (ECHO), select_per_sequence; the cost they
                     weigh, VerifyCost, is the planner's (planner/verify.py)
"""

from .acceptance import Acceptance
from .budget import Gates, VerifyCost, select_per_sequence, select_super_tree
from .draft_model import DraftModelDrafter, check_draft_compatible
from .lookup import NgramDrafter, SuffixDrafter
from .pacer import Pacer
from .tree import DraftTree, acceptance_walk

__all__ = ["Acceptance", "Pacer", "DraftTree", "acceptance_walk", "NgramDrafter", "SuffixDrafter", "DraftModelDrafter",
           "check_draft_compatible", "VerifyCost", "Gates", "select_super_tree", "select_per_sequence"]
