"""Declarative inference controllers: strategies (sampling, majority vote, best-of-N) as a
config tree whose nodes name registered controller types.

    ctl = from_config({"type": "majority_vote", "n": 8, "extract": r"(-?\\d+)",
                       "child": {"type": "generate", "temperature": 0.7, "max_tokens": 64}}, llm)
    outcome = ctl.run("What is 6 * 7?", seed=0)
    outcome.text, outcome.answer, outcome.candidates

Every leaf generation of one run is submitted to the LLM's step loop before any is waited
on, so the N samples of a node decode together and share the prompt's KV blocks.
"""

from .config import from_config, load_config
from .nodes import Controller, Outcome
from .registry import CONTROLLER_TYPES, REWARD_TYPES, register_controller, register_reward

__all__ = ["from_config", "load_config", "Controller", "Outcome", "CONTROLLER_TYPES", "REWARD_TYPES",
           "register_controller", "register_reward"]
