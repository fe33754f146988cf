"""The ACLs each `rollstream acl` role grants: prefixed on `<prefix>.`, but `jobs-reader`, which
reads the cluster's jobs topic alone."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from rollstream.cluster import acl


@pytest.mark.parametrize("role", sorted(set(acl.ROLES) - {"jobs-reader"}))
def test_every_role_is_prefixed_on_the_prefix(role: str) -> None:
    found = acl.bindings("User:fleet", "rs.team-a", role)
    assert found and {(b.name, b.resource_pattern_type) for b in found} == {
        ("rs.team-a.", ResourcePatternType.PREFIXED)}


def test_jobs_reader_reads_the_jobs_topic_and_nothing_else() -> None:
    found = acl.bindings("User:team-a", "rs", "jobs-reader")
    assert {(b.restype, b.name, b.resource_pattern_type, b.operation) for b in found} == {
        (ResourceType.TOPIC, "rs.jobs", ResourcePatternType.LITERAL, op)
        for op in (AclOperation.READ, AclOperation.DESCRIBE)}
