"""Runtime: pipeline workers, a controller of model instances, an OpenAI-compatible gateway.

Importing this package pulls in nothing heavy; torch, pyzmq and FastAPI are imported by the
modules that need them (`model`, `pipeline`, `worker`, `gateway`), so planning code that never
serves stays importable without the `runtime` extra.
"""
