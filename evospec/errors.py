"""The one exception type a user sees: the CLI prints its message, never a traceback."""


class EvospecError(Exception):
    """Bad input or an unusable environment, with a message that says what to do."""
