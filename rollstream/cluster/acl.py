"""Least privilege on a secured cluster: what each kind of Rollstream process may do on one
prefix, as Kafka ACLs (`rollstream acl`), and SCRAM users for principals.

Every grant is PREFIXED on `<prefix>.`: the prefix's topics, consumer groups and transactional
ids (every id Rollstream uses starts with the prefix), and nothing cluster-wide. A principal
granted one prefix is refused every other prefix's topics and groups. One role is narrower:
`jobs-reader` reads the cluster's jobs topic `<prefix>.jobs` alone (LITERAL), so that a job's
principal finds its job by name without any right on the other jobs' topics.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from rollstream.contracts.graph import Topics

Op = AclOperation
_READ = {ResourceType.TOPIC: (Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS),
         ResourceType.GROUP: (Op.READ, Op.DESCRIBE)}
_WRITE = {ResourceType.TOPIC: (Op.WRITE,),
          ResourceType.TRANSACTIONAL_ID: (Op.WRITE, Op.DESCRIBE)}
_OWN = {ResourceType.TOPIC: (Op.CREATE, Op.DELETE, Op.ALTER_CONFIGS),
        ResourceType.GROUP: (Op.DELETE,)}


def _union(*parts: dict[ResourceType, tuple[Op, ...]]) -> dict[ResourceType, tuple[Op, ...]]:
    merged: dict[ResourceType, tuple[Op, ...]] = {}
    for part in parts:
        for resource, ops in part.items():
            merged[resource] = merged.get(resource, ()) + ops
    return merged


# Role -> (what it is for, the operations on each resource type under the prefix).
ROLES: dict[str, tuple[str, dict[ResourceType, tuple[Op, ...]]]] = {
    "reader": ("status, replay to stdout, dlq list/show, the bridge printer: read topics, "
               "read and describe groups", _READ),
    "publisher": ("publish and replay into topics: reader's rights, write topics, "
                  "transactional ids", _union(_READ, _WRITE)),
    "stage": ("INIT, RUN, EVAL, the controller, dlq redrive: read and write topics, groups, "
              "transactional ids", _union(_READ, _WRITE)),
    "trainer": ("rollstream train and the trainer adapters: read scored, write policy, commit "
                "in transactions", _union(_READ, _WRITE)),
    "owner": ("topics create/delete and `rollstream stats` (its own internal topics): a "
              "stage's rights, create, delete and configure topics", _union(_READ, _WRITE, _OWN)),
    "jobs-reader": ("`--job NAME` as a job's principal (train, status): read the cluster's "
                    "jobs topic <prefix>.jobs, nothing else under the prefix",
                    {ResourceType.TOPIC: (Op.READ, Op.DESCRIBE)}),
}
# Roles on one topic of the prefix (LITERAL) instead of everything under it: role -> topic.
_ONE_TOPIC: dict[str, str] = {"jobs-reader": "jobs"}


def bindings(principal: str, prefix: str, role: str) -> list[AclBinding]:
    """The ACLs that give `principal` (`User:NAME`) `role` on `prefix`."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    if not principal.startswith("User:"):
        raise ValueError(f"principal {principal!r} must be User:NAME")
    if not prefix or prefix.endswith("."):
        raise ValueError(f"prefix {prefix!r}: give the topic prefix without its dot")
    one_topic = _ONE_TOPIC.get(role)
    name, pattern = ((getattr(Topics(prefix), one_topic), ResourcePatternType.LITERAL) if one_topic
                     else (f"{prefix}.", ResourcePatternType.PREFIXED))
    return [AclBinding(resource, name, pattern, principal, "*", op, AclPermissionType.ALLOW)
            for resource, ops in ROLES[role][1].items() for op in ops]


def grant(admin: Any, principal: str, prefix: str, role: str, timeout_s: float) -> list[str]:
    """Create the role's ACLs (an existing one is kept); their descriptions."""
    wanted = bindings(principal, prefix, role)
    for future in admin.create_acls(wanted, request_timeout=timeout_s).values():
        future.result()
    return [describe(b) for b in wanted]


def revoke(admin: Any, principal: str, prefix: str, role: str, timeout_s: float) -> int:
    """Delete the role's ACLs; how many were there."""
    filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host,
                                b.operation, b.permission_type)
               for b in bindings(principal, prefix, role)]
    return sum(len(f.result()) for f in
               admin.delete_acls(filters, request_timeout=timeout_s).values())


def listed(admin: Any, principal: str | None, timeout_s: float) -> list[str]:
    """Every ACL (of one principal), described."""
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal,
                                  None, AclOperation.ANY, AclPermissionType.ANY)
    return sorted(describe(b) for b in admin.describe_acls(everything,
                                                           request_timeout=timeout_s).result())


def describe(b: AclBinding) -> str:
    pattern = "prefixed" if b.resource_pattern_type == ResourcePatternType.PREFIXED else "literal"
    return (f"{b.principal} {b.permission_type.name.lower()} {b.operation.name} on "
            f"{b.restype.name.lower()} {b.name!r} ({pattern})")


def set_password(admin: Any, user: str, password: str, timeout_s: float,
                 mechanism: str = "SCRAM-SHA-512") -> None:
    """Create or update `user`'s credential for `mechanism` (SCRAM-SHA-512 or -256)."""
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism[mechanism.replace("-", "_")], 8192),
        password.encode())
    for future in admin.alter_user_scram_credentials([upsert],
                                                     request_timeout=timeout_s).values():
        future.result()
