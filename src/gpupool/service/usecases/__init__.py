"""The use-cases of gpupool: what a caller can ask the service to do, below the HTTP layer.

One module per use-case (submit, apply, cancel, drain, device_health, onboard); each is a
function (or a small class) over the ``Service`` (gpupool.service.core) and plain inputs,
returning plain results or raising the service's typed errors (gpupool.service.errors).

Why a layer of its own: the HTTP routes, the CLI's direct paths, the Kubernetes source and the
local backend all act on the service; when the use-cases lived in the route modules, those
callers imported route handlers (and FastAPI's request models) to submit or apply. Routes now
parse, call a use-case and shape the answer; nothing below them imports a route
(tests/test_layers.py checks it, imports inside functions included).
"""
