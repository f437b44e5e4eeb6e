"""The pure DBLog core: positions, keys, events, the window reconciler and dump planning.

Nothing in this package does I/O. Sources, the Redis store and the tailer feed it values and act
on what it returns, so the algorithm can be tested exhaustively without a server.
"""
