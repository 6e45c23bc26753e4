"""Reading a controller config (a dict, or a JSON / YAML file) and building its tree
depth-first, with one-line ``ConfigError``s that name the path of the bad node.

A value ``{"$ref": "name"}`` anywhere an object is expected (an extractor, a reward
function, a reward model) is looked up in the ``refs`` given to ``from_config``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import nodes, rewards  # noqa: F401  (their types register themselves)
from .nodes import Controller
from .registry import CONTROLLER_TYPES, REWARD_TYPES

ROOT = "controller"
MAX_SAMPLES = 64  # n of one node


def load_config(source: dict | str | os.PathLike) -> dict:
    """The config as a dict: ``source`` itself, or the JSON / YAML file it names."""
    if isinstance(source, dict):
        return source
    path = Path(source)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read controller config {path}: {e.strerror or e}") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - json and yaml raise their own kinds; one line either way
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"controller config {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                          f"{first}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"controller config {path}: the top level must be a mapping with a 'type'")
    return data


class Builder:
    """Builds nodes depth-first; ``take`` reads one argument of a node with its checks."""

    def __init__(self, refs: dict[str, Any] | None):
        self.refs = dict(refs or {})

    def error(self, path: str, msg: str) -> ConfigError:
        return ConfigError(f"controller config, at {path}: {msg}")

    def resolve(self, value, path: str):
        """``value``, or the object a ``{"$ref": name}`` names."""
        if isinstance(value, dict) and "$ref" in value:
            name = value["$ref"]
            if len(value) != 1 or not isinstance(name, str):
                raise self.error(path, "a $ref is {\"$ref\": \"name\"} and nothing else")
            if name not in self.refs:
                known = ", ".join(sorted(self.refs)) or "none given"
                raise self.error(path, f"unresolved $ref '{name}' (refs: {known})")
            return self.refs[name]
        return value

    def _typed(self, node, path: str, types: dict[str, type], what: str):
        if not isinstance(node, dict):
            raise self.error(path, f"a {what} is a mapping with a 'type' (got {node!r:.60})")
        kind = node.get("type")
        if kind is None:
            raise self.error(path, f"missing argument 'type' (one of: {', '.join(sorted(types))})")
        if kind not in types:
            raise self.error(path, f"unknown {what} type {kind!r} (known: {', '.join(sorted(types))})")
        return types[kind]

    def controller(self, node, path: str) -> Controller:
        cls = self._typed(node, path, CONTROLLER_TYPES, "controller")
        self.check_keys(node, path, cls.ARGS)
        return cls.from_node(node, path, self)

    def reward(self, node, path: str):
        if isinstance(node, str):  # shorthand: reward: logprob
            node = {"type": node}
        elif isinstance(node, dict) and "$ref" in node:  # shorthand: reward: {$ref: my_function}
            node = {"type": "function", "function": node}
        cls = self._typed(node, path, REWARD_TYPES, "reward")
        self.check_keys(node, path, cls.ARGS)
        return cls.from_node(node, path, self)

    def check_keys(self, node: dict, path: str, allowed) -> None:
        unknown = sorted(set(node) - {"type"} - set(allowed))
        if unknown:
            raise self.error(path, f"unknown argument '{unknown[0]}' for type '{node['type']}' "
                                   f"(arguments: {', '.join(sorted(allowed)) or 'none'})")

    def take(self, node: dict, path: str, name: str, required: bool = False, default=None):
        if name not in node:
            if required:
                raise self.error(path, f"missing argument '{name}' for type '{node['type']}'")
            return default
        return node[name]

    def samples(self, node: dict, path: str) -> int:
        n = self.take(node, path, "n", required=True)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
            raise self.error(f"{path}.n", f"n must be an integer in [1, {MAX_SAMPLES}] (got {n!r})")
        return n


def from_config(config: dict | str | os.PathLike, llm=None, refs: dict[str, Any] | None = None) -> Controller:
    """The controller tree of ``config`` (a dict or a JSON / YAML path), bound to ``llm``
    when given (``bind`` later otherwise).  ``refs``: the objects ``$ref`` may name."""
    root = Builder(refs).controller(load_config(config), ROOT)
    if llm is not None:
        root.bind(llm)
    return root
