# One image for every Rollstream process (stages, policy server, trainer, controller);
# docker-compose.yml and the Helm chart pick the command. `make image` builds it as
# rollstream:<version>; EXTRAS picks the optional parts: stats (`rollstream stats`) and hf (the
# trainer's --hf-model, and the chart's model download).
FROM python:3.11-slim
ARG EXTRAS=stats,hf
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY rollstream rollstream
COPY schemas schemas
COPY producers producers
COPY stages stages
COPY trainer_bridge trainer_bridge
COPY examples examples
RUN pip install --no-cache-dir ".[${EXTRAS}]"
ENTRYPOINT ["rollstream"]
