"""The REST API's endpoints, one APIRouter per area (health, tokens, config, workloads,
approvals, cluster, audit); ``gpupool.service.api.create_app`` adds them in that order and then
moves the submit route first (route matching is a linear scan).

Why per area: each module reads as the list of its endpoints and the few helpers they share;
what every area needs (Service, ApiError, the error handlers, the Caller/Svc dependencies)
lives in ``base``. Nothing is imported here, so ``base`` can be imported alone.
"""
