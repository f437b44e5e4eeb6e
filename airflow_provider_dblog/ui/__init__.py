"""`dblog ui`: a live view of one source, read from its Redis state store.

`snapshot.py` reads what the store already holds (the tailer's heartbeat and its metrics, the
watermark windows, the dumps' status, progress and controls) into one JSON snapshot;
`server.py` samples it while someone watches and serves it to the page in `static/` (plain
HTML, JS and CSS, no build step, nothing fetched from elsewhere), with the dump controls.
The tailer never knows the view exists: it writes nothing for it beyond its heartbeat.
"""
