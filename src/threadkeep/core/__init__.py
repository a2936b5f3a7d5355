"""Rules shared by every backend, free of I/O: identities, rows, heads, message chains."""
