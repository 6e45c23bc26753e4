"""An OpenAI-compatible HTTP server on the engine's step loop (``llcinfer serve``).

    from llcinfer import LLM
    from llcinfer.serve import create_app
    app = create_app(LLM("smollm2-135m", n_seq=4))   # an ASGI app: mount it, or
    uvicorn.run(app, host="127.0.0.1", port=8080)    # serve it

app.py holds the routes, admission and errors; protocol.py reads and checks request
bodies; responses.py writes the OpenAI objects; streaming.py carries the engine's text to
the event loop (server-sent events, cancellation, timeouts); metrics.py is /metrics.
"""

from .app import Server, create_app, create_server

__all__ = ["Server", "create_app", "create_server"]
