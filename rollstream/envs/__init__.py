"""Environment plug-ins: the interface (base), the registry, and the built-in environments."""
