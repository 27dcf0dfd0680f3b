"""Scale-out on Ray Serve: the same FastAPI app as a Ray Serve deployment, one engine per replica.

``build_deployment(...)`` wraps :func:`s2d2.serving.app.create_app` with ``@serve.deployment`` and
``serve.ingress`` (an app builder, evaluated on each replica: every replica loads the model and runs its
own engine thread); ``autoscaling`` scales on ongoing requests per replica. ``s2d2 serve --ray
--replicas N`` starts it on a local Ray cluster of its own (or on the cluster ``RAY_ADDRESS`` points to).
Ray is the optional extra ``ray`` (``pip install 's2d2[ray]'``).

**Shutdown** (:func:`serve_ray`). SIGTERM or SIGINT (Ctrl-C) stops it as the plain server stops. On a
cluster the command started itself, every replica drains (:mod:`.ray_drain`): new requests get a 503
with ``Retry-After`` while the running ones finish, for up to ``grace`` seconds; then
``serve.shutdown()`` and ``ray.shutdown()`` stop every process of that cluster; the exit status is 0.
On a cluster it joined (``RAY_ADDRESS``), only its own application is deleted (``serve.delete``: its
replicas let running requests finish, up to ``grace``, while the proxy still carries their streams)
and the cluster keeps running. A further signal during the shutdown is only logged (the shutdown,
bounded by ``grace``, goes on).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
from typing import Any

from ..errors import S2D2Error
from .ray_drain import POLL_S, running_replicas, wait_idle

log = logging.getLogger("s2d2.serving")
#: The Ray Serve application's name (``serve.delete`` takes it).
APP_NAME = "s2d2"


def _ray_serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        raise S2D2Error("s2d2 serve --ray needs Ray Serve: pip install 's2d2[ray]'") from None
    return serve


def build_deployment(
    model: str = "tiny-gsm",
    *,
    replicas: int = 1,
    autoscale_max: int | None = None,
    target_ongoing_requests: int = 16,
    device: str | None = None,
    dtype: str | None = None,
    num_cpus: float = 1.0,
    load_options: dict[str, Any] | None = None,
    grace: float | None = None,
    drain_flag: str | None = None,
    **app_options: Any,
) -> Any:
    """A bound Ray Serve application serving ``model`` (``load_options`` go to ``s2d2.load``, e.g. the KV
    memory settings; ``app_options`` to ``create_app``; ``grace``: seconds a replica's running requests
    get to finish when it stops, Ray Serve's default if None; ``drain_flag``: the file whose appearance
    makes every replica drain, :mod:`.ray_drain`)."""
    serve = _ray_serve()
    rows = app_options.get("max_num_seqs") or 16

    def build_app() -> Any:
        from ..model import freeze_loaded_heap, load
        from .app import create_app

        m = load(model, device=device, dtype=dtype, max_num_seqs=rows, **(load_options or {}))
        app = create_app(m, **app_options)
        if drain_flag is not None:
            from .ray_drain import watch_flag

            watch_flag(app, drain_flag)
        freeze_loaded_heap()
        return app

    scaling: dict[str, Any] = {"num_replicas": replicas}
    if autoscale_max is not None and autoscale_max > replicas:
        scaling = {
            "autoscaling_config": {
                "min_replicas": replicas,
                "max_replicas": autoscale_max,
                "target_ongoing_requests": target_ongoing_requests,
            }
        }
    deployment = serve.deployment(
        serve.ingress(build_app)(),
        name="s2d2",
        max_ongoing_requests=rows + int(app_options.get("max_queue", 64)),
        ray_actor_options={"num_cpus": num_cpus},
        **({"graceful_shutdown_timeout_s": grace} if grace is not None else {}),
        **scaling,
    )
    return deployment.bind()


def run(model: str = "tiny-gsm", *, host: str = "127.0.0.1", port: int = 8000, **options: Any) -> Any:
    """Start Ray Serve's HTTP proxy on ``host:port`` and deploy; returns the ingress handle."""
    serve = _ray_serve()
    serve.start(http_options={"host": host, "port": port})
    return serve.run(build_deployment(model, **options), name=APP_NAME, route_prefix="/")


def serve_ray(model: str, *, host: str, port: int, grace: float = 30.0, **options: Any) -> None:
    """``s2d2 serve --ray``: deploy, serve until SIGTERM or SIGINT, then shut down (module docstring)."""
    import ray

    serve = _ray_serve()
    ours = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    if ours:  # a local cluster of our own: no dashboard (nothing serves it), stopped by ray.shutdown()
        ray.init(include_dashboard=False)
    stop = threading.Event()
    flag = None
    if ours:  # replicas on this machine: they drain when this file appears (.ray_drain)
        folder = tempfile.mkdtemp(prefix="s2d2-drain-")
        flag = os.path.join(folder, "drain")

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():
            log.warning("already shutting down (up to %gs for running requests)", grace)
        stop.set()

    # after ray.init, which installs a SIGTERM handler of its own (sys.exit, skipping Serve's shutdown)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        run(model, host=host, port=port, grace=grace, drain_flag=flag, **options)
        while not stop.wait(POLL_S):
            pass
        log.info("stop signal: admitting no new requests, finishing the running ones (%gs)", grace)
        if flag is not None:  # new requests get 503 + Retry-After while the running ones finish
            wait_idle(flag, running_replicas(serve, APP_NAME), grace)
    finally:
        try:
            if ours:  # drained: stop the proxy and replicas (connections are then refused, not 404)
                serve.shutdown()
            else:
                # a joined cluster: the application's replicas let running requests finish (up to
                # ``grace``) while the proxy still carries their streams
                serve.delete(APP_NAME)
        finally:
            ray.shutdown()  # ours: stops every process of the cluster; joined: disconnects only
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if flag is not None:
                shutil.rmtree(os.path.dirname(flag), ignore_errors=True)
