# syntax=docker/dockerfile:1
# A stand-in for docker.io/vllm/vllm-openai:v0.33.0 on machines without registry access (and
# without a GPU): the exact vllm==0.33.0 wheel installed without its GPU dependencies, beside
# CPU torch and the pure-Python packages its config, platform and patch targets import. Enough
# to build docker/vllm.Dockerfile and run its patch step and self check; it cannot serve.
#
#   make images-local   (builds it as localhost/dflash-serve/vllm-openai-standin:v0.33.0, with
#                        the cached wheel directory mounted at /wheels: podman build -v)
FROM docker.io/library/python:3.11.11-slim-bookworm
COPY ops/setup/vllm033-requirements.txt /tmp/
RUN python -m pip install --no-cache-dir torch==2.13.0 -r /tmp/vllm033-requirements.txt \
    && python -m pip install --no-cache-dir --no-deps /wheels/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl \
    && rm /tmp/vllm033-requirements.txt
ENTRYPOINT ["vllm", "serve"]
