"""Ray Serve, or one line saying how to get it."""

from __future__ import annotations

from ..errors import UsageError

EXTRA_HINT = "Ray Serve is not installed: pip install -e \".[ray]\" (the 'ray' extra: ray[serve])"


def require_ray():
    """``(ray, ray.serve)``; a ``UsageError`` naming the extra when Ray Serve cannot be
    imported."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise UsageError(EXTRA_HINT) from None
    return ray, serve
