"""One module per ``recovery`` verb, each with ``register(subparsers)``."""
