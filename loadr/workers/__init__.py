"""Worker processes: the pool, the worker loop, the messages, the shared memory."""
