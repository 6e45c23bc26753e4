"""llcinfer replicas on Ray Serve (``llcinfer serve --ray``; the ``ray`` extra).

    from ray import serve
    from llcinfer.ray_serve import deployment
    serve.run(deployment("smollm2-135m", replicas="auto"))   # OpenAI routes on Serve's proxy

build.py makes the application (one deployment per replica on its planner core set, one
ingress) and runs it; replica.py is a replica (an ``LLM`` behind ``llcinfer serve``'s
``Server``); ingress.py holds the routes, relaying and retries; routing.py the
prefix-aware choice of a replica.  Importing this package does not import Ray: that
happens in ``deployment()``, which says how to install it when it is missing.
"""

from .build import deployment, replica_cores, serve_until_interrupted, start, stop
from .ray_import import EXTRA_HINT, require_ray
from .routing import PrefixRouter, routing_units

__all__ = ["EXTRA_HINT", "PrefixRouter", "deployment", "replica_cores", "require_ray", "routing_units",
           "serve_until_interrupted", "start", "stop"]
