# One image for every Rollstream process (stages, policy server, bridge); docker-compose.yml
# picks the command.
FROM python:3.11-slim
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
RUN pip install --no-cache-dir '.[stats]'
ENTRYPOINT ["rollstream"]
