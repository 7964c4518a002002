"""How a backend's generation fails, as the gateway tells it apart for the client (a
module of its own, so that the engine can raise them without importing the backends)."""

from __future__ import annotations


class BackendError(RuntimeError):
    """Generation failed inside the backend (e.g. a worker was lost)."""


class RetriableBackendError(BackendError):
    """The instance serving the request was lost after it had produced tokens; sending the
    request again (it restarts from the prompt) is safe."""


class RequestFailedError(BackendError):
    """The request's own computation failed (its sampling, say) while the instance stays
    healthy: running it again elsewhere would fail the same way, so it is not."""


class PoisonRequestError(BackendError):
    """The request was in flight each time its model's workers died, repeatedly: it is taken
    for the cause and not run again."""


class ModelUnavailableError(BackendError):
    """The model has no ready instance to run the request (all lost, restarting or given up
    on): the server's state, not the request's fault, so the client may send it again later."""

    def __init__(self, message: str, retry_after_s: int = 5):
        super().__init__(message)
        self.retry_after_s = max(1, int(retry_after_s))
        """Seconds after which the client may expect the model back (a hint)."""
