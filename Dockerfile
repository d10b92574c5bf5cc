# The served pipeline as an image: `willump serve` of an artifact mounted at /artifact.
#
#   make image                       # docker build -t willump-serve .
#   docker run --rm -p 8000:8000 --shm-size=2g \
#       -v "$PWD/my.willump:/artifact:ro" -e WILLUMP_API_KEY="$(willump keygen)" willump-serve
#
# The app listens on 0.0.0.0:8000 under /willump (`--name` changes it; then set
# WILLUMP_HEALTH_PATH=/<name>/healthz for the health check) and requires the key on every route
# but /healthz. Ray keeps objects in /dev/shm:
# give the container room there (--shm-size). Extras: `--build-arg EXTRAS=serve,onnx,torch` for
# torch feature groups (CPU wheels from TORCH_INDEX). An artifact whose feature code lives in
# your own modules needs them installed too: `FROM willump-serve`, then copy and install them.
FROM python:3.11-slim

ARG EXTRAS=serve,onnx
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV RAY_USAGE_STATS_ENABLED=0 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/willump
COPY pyproject.toml README.md LICENSE ./
COPY willump ./willump
COPY serving ./serving
COPY drift ./drift
RUN pip install --extra-index-url "${TORCH_INDEX}" ".[${EXTRAS}]" \
    && useradd --create-home --uid 1000 willump
USER willump
WORKDIR /home/willump

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s \
    CMD python -c "import urllib.request, os; urllib.request.urlopen('http://127.0.0.1:8000' + os.environ.get('WILLUMP_HEALTH_PATH', '/willump/healthz'), timeout=4)" || exit 1
ENTRYPOINT ["willump"]
CMD ["serve", "/artifact", "--host", "0.0.0.0", "--port", "8000", "--api-key-env", "WILLUMP_API_KEY", "--require-key"]
