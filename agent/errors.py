"""Why an apply failed, as the agent reports it; below backends and host so that both may raise them."""


class ApplyError(Exception):
    """A desired config that could not be applied; the text becomes the outcome's message."""


class BusyError(ApplyError):
    """Compute processes hold a GPU the change touches (NVML_ERROR_IN_USE included): outcome `refused_busy`."""
