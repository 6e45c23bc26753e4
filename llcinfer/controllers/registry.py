"""The controller and reward types a config may name (``type:``), by name."""

from __future__ import annotations

CONTROLLER_TYPES: dict[str, type] = {}  # name -> Controller subclass with from_node(node, path, builder)
REWARD_TYPES: dict[str, type] = {}  # name -> Reward subclass with from_node(node, path, builder)


def register_controller(name: str):
    """Class decorator: make a Controller subclass available as ``type: name``."""
    def add(cls):
        CONTROLLER_TYPES[name] = cls
        cls.type_name = name
        return cls
    return add


def register_reward(name: str):
    """Class decorator: make a Reward subclass available as ``reward: {type: name}``."""
    def add(cls):
        REWARD_TYPES[name] = cls
        cls.type_name = name
        return cls
    return add
