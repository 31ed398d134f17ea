# gpupool's container image: the wheel with its packaged defaults, on a slim Python, as a
# non-root user. Build: docker build -t gpupool:0.1.0 .   (docs/install.md, "The image")
# tests/test_install.py runs these install steps in a clean virtualenv (images are not built
# in our CI); tests/deploy/test_deploy.py checks this file's shape.
ARG PYTHON_VERSION=3.11

# -- build: the gpupool wheel, and wheels of its runtime dependencies -----------------------------
FROM python:${PYTHON_VERSION}-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist . \
 && python -m pip wheel --no-cache-dir --wheel-dir /deps /dist/gpupool-*.whl

# -- runtime: no compiler, no sources, no dev tools ---------------------------------------------
FROM python:${PYTHON_VERSION}-slim AS runtime
RUN groupadd --system --gid 10001 gpupool \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/gpupool --shell /usr/sbin/nologin gpupool \
 && mkdir -p /var/lib/gpupool && chown 10001:10001 /var/lib/gpupool
COPY --from=build /deps /tmp/wheels
# only the wheels built above (--no-index): the gpupool wheel is the one this build made
RUN python -m pip install --no-cache-dir --no-index --find-links /tmp/wheels gpupool \
 && rm -rf /tmp/wheels \
 && python -m pip uninstall -y pip setuptools wheel
USER 10001:10001
WORKDIR /var/lib/gpupool
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
EXPOSE 8080 9443
HEALTHCHECK --interval=30s --timeout=3s --start-period=20s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=3)"]
ENTRYPOINT ["gpupool"]
CMD ["serve", "--host", "0.0.0.0", "--state-dir", "/var/lib/gpupool"]
