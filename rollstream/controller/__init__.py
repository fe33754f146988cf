"""The inference controller: a service that applies each new policy version to the servers."""
