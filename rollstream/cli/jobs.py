"""`rollstream jobs create|apply|list|show|pause|resume|cancel|delete|usage|token`: the training
jobs a shared fleet serves, as records on the cluster's compacted jobs topic
(rollstream.service.jobs)."""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path
from typing import Any

from rollstream import config
from rollstream.cli import common
from rollstream.cluster.topics import create_topics
from rollstream.config import Settings
from rollstream.contracts.events import Job
from rollstream.service import jobs, usage

# The job fields `create` takes as flags: name -> (type, help).
FIELD_FLAGS: dict[str, tuple[type, str]] = {
    "prefix": (str, "the job's topic prefix (default: <cluster prefix>.<name>)"),
    "principal": (str, "the Kafka principal that gets the prefix's ACLs (`rollstream acl`)"),
    "adapter": (str, "the job's LoRA adapter on the shared inference servers"),
    "policy_urls": (str, "the job's own inference servers, comma separated (instead of an "
                         "adapter on the shared ones)"),
    "weight": (float, "share of the fleet's inference slots when saturated (default 1)"),
    "priority": (int, "higher takes free slots first; never preempts (default 0)"),
    "quota_episodes": (int, "episodes in flight in RUN's fleet at most (default 0: none)"),
    "quota_sandboxes": (int, "sandboxes at once at most (default 0: none)"),
    "quota_tasks_queued": (int, "tasks INIT has expanded whose episodes RUN has not finished "
                                "(waiting or running) at most: INIT takes no more of the job's "
                                "tasks at the quota (default 0: none)"),
    "quota_turns_per_s": (float, "agent turns per second at most, over the RUN fleet "
                                 "(default 0: none)"),
    "admission_window": (int, "INIT admits at most this many tasks beyond what the trainer "
                              "consumed (default 0: no limit)"),
    "max_staleness": (int, "policy versions a trained-on sample may lag (0: trainer default)"),
    "retries_infra": (int, "times an episode is played again, in a fresh environment, after "
                           "an infrastructure failure (default 2; environment errors never)"),
    "group_policy": (str, "a group that lost a sample for good (retries spent, or it never "
                          "came): drop it whole (default) or train on the rest (partial)"),
    "group": (str, "a dedicated fleet's name (`rollstream fleet --fleet NAME`); default: the "
                   "shared fleet"),
}
# Shorter flags some fields also take.
FLAG_ALIASES: dict[str, tuple[str, ...]] = {"retries_infra": ("--retries",)}
# State changes: command -> (new state, states it may come from, what it does).
TRANSITIONS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "pause": ("PAUSED", ("RUNNING",),
              "stop serving the job: its stages drain and stop; nothing is dropped"),
    "resume": ("RUNNING", ("PAUSED",), "serve a paused job again, from where it stopped"),
    "cancel": ("CANCELLED", ("RUNNING", "PAUSED", "DRAINING"),
               "stop the job for good: its stages stop, its sandboxes close"),
}


def _dest(field: str) -> str:
    """A job field's flag destination (`--prefix` is the cluster's: the job's is another)."""
    return "job_prefix" if field == "prefix" else field


def _fields_from_args(args: argparse.Namespace) -> dict[str, Any]:
    fields = {k: getattr(args, _dest(k)) for k in FIELD_FLAGS
              if getattr(args, _dest(k)) is not None}
    if "policy_urls" in fields:
        fields["policy_urls"] = [u.strip() for u in fields["policy_urls"].split(",") if u.strip()]
    return fields


def _read_file(path: Path) -> dict[str, Any]:
    """A job file: TOML (`*.toml`) or JSON, one job's fields with its `name`."""
    if not path.is_file():
        raise jobs.JobError(f"job file not found: {path}")
    try:
        data = (tomllib.loads(path.read_text()) if path.suffix == ".toml"
                else json.loads(path.read_text()))
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise jobs.JobError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'}"
                            f": {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise jobs.JobError(f"{path}: a job file holds one job's fields, `name` among them")
    return data


def _create_job_topics(settings: Settings, job: Job, replication_factor: int) -> None:
    created = create_topics(settings.kafka(), job["prefix"], settings.partitions,
                            replication_factor, timeout=settings.timeout_s,
                            specs=jobs.JOB_TOPICS)
    print(f"topics under {job['prefix']}: {len(created)} created, "
          f"{len(jobs.JOB_TOPICS) - len(created)} already there")


def _settings(args: argparse.Namespace) -> Settings:
    """The command's settings, with the cluster's jobs topic there (created when missing)."""
    settings = common.settings(args)
    create_topics(settings.kafka(), settings.prefix,
                  replication_factor=getattr(args, "replication_factor", 1),
                  timeout=settings.timeout_s, specs=jobs.CLUSTER_TOPICS)
    return settings


def _create(args: argparse.Namespace) -> int:
    settings = _settings(args)
    job = jobs.new_job(args.job, settings.prefix, **_fields_from_args(args))
    if args.job in jobs.current(settings):
        raise jobs.JobError(f"job {args.job!r} exists; change it with `rollstream jobs apply`")
    _create_job_topics(settings, job, args.replication_factor)
    jobs.put(settings, job)
    print(f"created job {job['name']} (prefix {job['prefix']}, weight {job['weight']:g})")
    _print_grants(settings, job)
    return 0


def _print_grants(settings: Settings, job: Job) -> None:
    """The `rollstream acl` commands that give the job's principal its prefix and nothing
    else (and the fleet's principal a job prefix outside the cluster's), one per line."""
    if not job["principal"]:
        return
    print("grants, to run as the cluster's administrator (docs/security.md):")
    print(f"  rollstream acl grant {job['principal']} --role trainer --prefix {job['prefix']}"
          "  # train, publish tasks")
    print(f"  rollstream acl grant {job['principal']} --role jobs-reader --prefix "
          f"{settings.prefix}  # --job {job['name']}")
    if not job["prefix"].startswith(f"{settings.prefix}."):
        print(f"  rollstream acl grant FLEET_PRINCIPAL --role stage --prefix {job['prefix']}"
              "  # the fleet: the job's prefix is outside the cluster's")


def _apply(args: argparse.Namespace) -> int:
    settings = _settings(args)
    data = _read_file(args.file)
    name = data.pop("name")
    state = data.pop("state", None)
    old = jobs.current(settings).get(name)
    job = jobs.new_job(name, settings.prefix, **data)
    if old is not None:
        if old["prefix"] != job["prefix"]:
            raise jobs.JobError(f"job {name!r} has prefix {old['prefix']!r}; a job's prefix "
                                "cannot change (delete it and create a new one)")
        job["created_at_ms"] = old["created_at_ms"]
        job["state"] = old["state"]
        job["api_tokens"] = old["api_tokens"]  # managed by `jobs token` only
    if state is not None:
        job["state"] = state
    jobs.validate(job, settings.prefix)
    if old is None:
        _create_job_topics(settings, job, args.replication_factor)
    jobs.put(settings, job)
    print(f"{'updated' if old else 'created'} job {name} (state {job['state']})")
    _print_grants(settings, job)
    return 0


def _list(args: argparse.Namespace) -> int:
    found = jobs.current(_settings(args))
    if not found:
        print("no jobs; create one with `rollstream jobs create NAME`")
        return 0
    rows = [("NAME", "STATE", "PREFIX", "WEIGHT", "PRIORITY", "POLICY", "FLEET")]
    for job in found.values():
        policy = job["adapter"] or ",".join(job["policy_urls"]) or "(base model)"
        rows.append((job["name"], job["state"], job["prefix"], f"{job['weight']:g}",
                     str(job["priority"]), policy, job["group"] or "(shared)"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _show(args: argparse.Namespace) -> int:
    job = jobs.get(_settings(args), args.job)
    print(json.dumps({**job, "api_tokens": jobs.token_ids(job)}, indent=2))
    return 0


def _token(args: argparse.Namespace) -> int:
    """Create, rotate, list or revoke the job's HTTP API tokens (rollstream.api). A new token
    is printed once, alone on stdout (for `$(...)`); only its hash is stored."""
    settings = _settings(args)
    job = jobs.get(settings, args.job)
    entries = list(job["api_tokens"])
    ids = jobs.token_ids(job)
    if args.token_command == "list":
        print("\n".join(ids) if ids else f"job {args.job} has no API tokens")
        return 0
    if args.token_command == "revoke":
        if args.id not in ids:
            raise jobs.JobError(f"job {args.job!r} has no API token {args.id!r}; its tokens: "
                                f"{ids or 'none'}")
        entries = [e for e in entries if not e.startswith(f"{args.id}:")]
    token = ""
    if args.token_command in ("create", "rotate"):
        token, entry = jobs.new_token()
        # rotate: the new token replaces every old one in the same record (no gap, no overlap)
        entries = [*(entries if args.token_command == "create" else []), entry]
    jobs.put(settings, {**job, "api_tokens": entries, "updated_at_ms": jobs.now_ms()})  # type: ignore[typeddict-item]
    if token:
        print(token)
    else:
        print(f"job {args.job}: API token {args.id} revoked")
    return 0


def _transition(args: argparse.Namespace) -> int:
    state, sources, _ = TRANSITIONS[args.jobs_command]
    settings = _settings(args)
    job = jobs.get(settings, args.job)
    if job["state"] not in sources:
        raise jobs.JobError(f"job {args.job!r} is {job['state']}; `{args.jobs_command}` takes "
                            f"a job that is {' or '.join(sources)}")
    jobs.put(settings, {**job, "state": state, "updated_at_ms": jobs.now_ms()})  # type: ignore[typeddict-item]
    print(f"job {args.job}: {job['state']} -> {state}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    settings = _settings(args)
    job = jobs.get(settings, args.job)
    if job["state"] == "RUNNING":
        raise jobs.JobError(f"job {args.job!r} is RUNNING; cancel it first (`rollstream jobs "
                            "cancel`) so that its stages stop before its record goes")
    jobs.put(settings, None, name=args.job)
    print(f"deleted job {args.job} (its topics under {job['prefix']} are kept)")
    return 0


def _usage(args: argparse.Namespace) -> int:
    settings = _settings(args)
    found = jobs.current(settings)
    if args.job is not None:
        found = {args.job: jobs.get(settings, args.job)}
    try:
        since = usage.parse_since(args.since) if args.since else 0
    except ValueError as exc:
        raise jobs.JobError(str(exc)) from None
    rows = usage.usage(settings, found.values(), since)
    if args.json:
        for row in rows:  # one JSON object per job and hour, a line each
            print(json.dumps(row.as_json()))
    elif rows:
        print(usage.table(rows))
    else:
        print("no usage recorded" + (f" since {args.since}" if args.since else ""))
    return 0


def _checked(func: Any) -> Any:
    """A bad job or file ends the command with its reason, not a traceback."""
    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except jobs.JobError as exc:
            raise SystemExit(f"rollstream jobs: {exc}") from None
    return run


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "jobs", help="training jobs served by the shared fleet",
        description="Jobs are records on the cluster's compacted <prefix>.jobs topic (--prefix "
                    "is the cluster's); a shared fleet (`rollstream fleet`) serves every "
                    "RUNNING job under the job's own prefix. See docs/jobs.md.")
    commands = parser.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)

    def command(name: str, func: Any, help: str, description: str = "",
                takes_name: bool = True, groups: tuple[str, ...] = ()
                ) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=help, description=description or help)
        if takes_name:
            p.add_argument("job", metavar="NAME", help="the job's name")
        config.add_arguments(p, "kafka", "command", *groups)
        if "topics" in groups:
            p.add_argument("--replication-factor", type=int, default=1,
                           help="replicas per partition of the topics it creates (default 1; "
                                "3 on a 3-node cluster)")
        p.set_defaults(func=_checked(func))
        return p

    create = command(
        "create", _create, "create a RUNNING job and its topics",
        "Create a job: its record on <prefix>.jobs and its topics under the job's prefix (as "
        "`rollstream topics create` does; --partitions applies). Publish tasks to "
        "<job prefix>.tasks; train on <job prefix>.scored (`rollstream train --job NAME`).",
        groups=("topics",))
    fields = create.add_argument_group("the job (each flag left out takes its default)")
    for field, (kind, text) in FIELD_FLAGS.items():
        fields.add_argument("--" + _dest(field).replace("_", "-"), *FLAG_ALIASES.get(field, ()),
                            dest=_dest(field), type=kind, default=None, help=text)
    apply = command(
        "apply", _apply, "create or update a job from a TOML or JSON file",
        "Create or update a job from a file (TOML when it ends in .toml, else JSON) holding its "
        f"`name` and any of: {', '.join(FIELD_FLAGS)}, state. Fields the file leaves out take "
        "their defaults; an update keeps the job's prefix, creation time and (unless the file "
        "names one) state.", takes_name=False, groups=("topics",))
    apply.add_argument("file", type=Path, metavar="FILE", help="the job file")
    command("list", _list, "the jobs, their state, prefix, weight and policy", takes_name=False)
    command("show", _show, "one job's record, as JSON")
    for name, (_, sources, what) in TRANSITIONS.items():
        command(name, _transition, what, f"{what[0].upper()}{what[1:]} (a job that is "
                f"{' or '.join(sources)}).")
    usage_cmd = command(
        "usage", _usage, "per job and hour: episodes, turns, sampled tokens, failure classes, "
        "dead letters, server and environment seconds",
        "Each job's usage per UTC hour, read from its committed records (exact after a crash): "
        "episodes, agent turns, sampled tokens, failure classes and the turns' seconds on the "
        "inference servers and in the environment from <job prefix>.scored, dead letters from "
        "<job prefix>.dlq. See docs/jobs.md#usage.", takes_name=False)
    usage_cmd.add_argument("--job", metavar="NAME", help="one job only (default: every job)")
    usage_cmd.add_argument("--since", metavar="WHEN",
                           help="from then on: a time ago (90m, 6h, 2d) or an ISO date/time, "
                                "UTC unless it says (default: everything)")
    usage_cmd.add_argument("--json", action="store_true",
                           help="one JSON object per job and hour, a line each")
    token = commands.add_parser(
        "token", help="the job's HTTP API bearer tokens (`rollstream api`)",
        description="A job's callers authenticate to `rollstream api` with a bearer token of the "
                    "job, which reaches that job's tasks, results and events only. The job's "
                    "record stores each token's id and SHA-256, never the token: `create` and "
                    "`rotate` print the new token once, alone on stdout; keep it then. See "
                    "docs/api.md#tokens.")
    token_commands = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    for name, text in (("create", "add a token and print it (the job's other tokens stay)"),
                       ("rotate", "replace every token of the job by a new one, printed"),
                       ("list", "the ids of the job's tokens"),
                       ("revoke", "remove one token, by its id (`list` shows them)")):
        p = token_commands.add_parser(name, help=text, description=text[0].upper() + text[1:])
        p.add_argument("job", metavar="NAME", help="the job's name")
        if name == "revoke":
            p.add_argument("id", metavar="ID", help="the token's id")
        config.add_arguments(p, "kafka", "command")
        p.set_defaults(func=_checked(_token))
    command("delete", _delete, "delete a paused, cancelled or finished job's record",
            "Write the job's tombstone; its topics and their data are kept (delete them with "
            "your cluster's tools once no trainer needs them).")
