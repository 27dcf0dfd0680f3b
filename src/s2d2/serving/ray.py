"""Scale-out on Ray Serve: the same FastAPI app as a Ray Serve deployment, one engine per replica.

``build_deployment(...)`` wraps :func:`s2d2.serving.app.create_app` with ``@serve.deployment`` and
``serve.ingress`` (an app builder, evaluated on each replica: every replica loads the model and runs its
own engine thread); ``autoscaling`` scales on ongoing requests per replica. ``s2d2 serve --ray
--replicas N`` starts it on the local Ray (or the cluster ``RAY_ADDRESS`` points to). Ray is the optional
extra ``ray`` (``pip install 's2d2[ray]'``).
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import S2D2Error


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
    **app_options: Any,
) -> Any:
    """A bound Ray Serve application serving ``model`` (``load_options`` go to ``s2d2.load``, e.g. the KV
    memory settings; ``app_options`` to ``create_app``)."""
    serve = _ray_serve()
    rows = app_options.get("max_num_seqs") or 16

    def build_app() -> Any:
        from ..model import freeze_loaded_heap, load
        from .app import create_app

        m = load(model, device=device, dtype=dtype, max_num_seqs=rows, **(load_options or {}))
        app = create_app(m, **app_options)
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
        **scaling,
    )
    return deployment.bind()


def run(model: str = "tiny-gsm", *, host: str = "127.0.0.1", port: int = 8000, **options: Any) -> Any:
    """Start Ray Serve's HTTP proxy on ``host:port`` and deploy; returns the ingress handle."""
    serve = _ray_serve()
    serve.start(http_options={"host": host, "port": port})
    return serve.run(build_deployment(model, **options), name="s2d2", route_prefix="/")


def serve_ray(model: str, *, host: str, port: int, **options: Any) -> None:
    """``s2d2 serve --ray``: deploy, then wait until interrupted (Ctrl-C / SIGTERM) and shut down."""
    serve = _ray_serve()
    run(model, host=host, port=port, **options)
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
