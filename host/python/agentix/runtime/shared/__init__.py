"""Pieces shared by the host client and the sandbox side: callable identity
(`callables`), the sandbox -> host value allowlist (`safepickle`), and the
plain data models exchanged with the runtime (`models`)."""

# Largest payload (encoded arguments or result value) a remote call may carry.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

__all__ = ["MAX_MESSAGE_BYTES"]
