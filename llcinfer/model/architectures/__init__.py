"""Architecture registry: ``general.architecture`` -> module with the architecture contract
(``NAME``, ``ROPE_NEOX``, ``QKV_BIAS``, ``read_config(f)``, ``load_weights(f, cfg, matrix)``)."""

from types import ModuleType

from ...errors import UnsupportedModelError
from . import llama, qwen2

ARCHITECTURES: dict[str, ModuleType] = {m.NAME: m for m in (llama, qwen2)}


def get_architecture(name: str) -> ModuleType:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise UnsupportedModelError(
            f"unknown architecture '{name}' (supported: {', '.join(sorted(ARCHITECTURES))})"
        ) from None
